"""Why a checkpoint cannot or must not be used (reported in one line by :mod:`..excepthook`)."""


class CheckpointError(Exception):
    """A checkpoint the plugin will not use; the message says why and what to do."""


class CheckpointRefused(CheckpointError):
    """A checkpoint whose configuration could run code."""


class DictionaryMismatch(CheckpointError):
    """A checkpoint used with dictionaries other than the ones it was trained with."""
