"""The one exception type of the preprocessing package, and a full disk said as one."""
import errno
from contextlib import contextmanager
from typing import Iterator

# A write failed for want of space: the disk, the user's quota, or a file-size limit
# (``ulimit -f``, RLIMIT_FSIZE).
FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class PreprocessError(Exception):
    """A problem with the user's input or environment; the message names the file and the fix.

    The command-line wrappers print it as ``error: <message>`` and exit with status 1
    instead of showing a traceback.
    """


def full_disk_error(where: str, exc: OSError) -> PreprocessError:
    """The error that says what could not be written, why, and what to do."""
    return PreprocessError(
        f"{where}: cannot write, {exc.strerror} ({errno.errorcode.get(exc.errno, exc.errno)}): "
        "the disk or your quota is full, or a file-size limit (`ulimit -f`) was reached; "
        "nothing half-written was kept: free some space and rerun the same command")


@contextmanager
def full_disk_reported(where: str) -> Iterator[None]:
    """Turn an ``OSError`` of a full disk in the block into a :class:`PreprocessError`
    naming the file (if the error does) or ``where``."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in FULL_DISK:
            raise
        raise full_disk_error(exc.filename or where, exc) from None
