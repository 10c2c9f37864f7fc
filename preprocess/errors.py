"""The one exception type of the preprocessing package."""


class PreprocessError(Exception):
    """A problem with the user's input or environment; the message names the file and the fix.

    The command-line wrappers print it as ``error: <message>`` and exit with status 1
    instead of showing a traceback.
    """
