"""One run at a time per output folder.

Two runs writing the same folder (``convs2s-prepare -o``, ``convs2s-align-dict -o``, a
recipe's work folder) would rename complete files over each other's and record what
neither built. So a command that writes a folder first takes its lock: an exclusive
``fcntl.flock`` on ``FOLDER/.convs2s.lock``, a file holding the locking run's pid and
command line. A second run into the same folder stops at once with one line naming the
first (:class:`FolderInUse`, a :class:`PreprocessError`).

A run killed by SIGKILL cannot unlock, but the kernel drops a ``flock`` when the last
descriptor of the file is closed, which a process's death does; so the next run takes the
lock over and says whose it was. The descriptor is not inherited by child processes (Python
opens it close-on-exec), so a child left running cannot keep a dead run's folder locked.

The lock file is removed when the lock is released, while it is still held; a run that had
opened the removed file before then checks, once it holds the lock, that the file it locked
is still the one at the path, and tries again if not, so two runs can never each hold a
lock on a different file. Within one process the lock is re-entrant (a recipe holding its
work folder builds the alignment dictionary into it).

``flock`` is advisory and local: it does not stop a program that ignores it, and on NFS it
may lock on this host only.
"""
import fcntl
import logging
import os
import shlex
import sys
from contextlib import contextmanager, suppress
from typing import Iterator

from ..errors import PreprocessError

logger = logging.getLogger(__name__)

LOCK_NAME = ".convs2s.lock"
_held = {}  # real path of a folder -> [descriptor, depth] of the locks this process holds


class FolderInUse(PreprocessError):
    """Another live run holds the folder's lock."""


def _holder(fd: int) -> str:
    """What the lock file says about its holder: ``pid N: COMMAND`` (or that it says nothing)."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 65536).decode("utf-8", "replace").strip()
    pid, _, command = text.partition(" ")
    return f"pid {pid}: {command}" if pid.isdigit() else "a run that has not yet written its pid"


def _acquire(folder: str, path: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise FolderInUse(
                f"{folder} is being written by another run ({holder}); wait for it to end, "
                "or give this run another output folder") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        os.close(fd)  # the file was removed by the run that released it: lock the new one


@contextmanager
def output_lock(folder: str) -> Iterator[None]:
    """Hold ``folder``'s lock (creating the folder) for the block, or raise :class:`FolderInUse`."""
    os.makedirs(folder, exist_ok=True)
    key = os.path.realpath(folder)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    path = os.path.join(key, LOCK_NAME)
    fd = _acquire(folder, path)
    try:
        left = _holder(fd)
        if not left.startswith("a run that"):
            logger.info("%s: taking over the lock of a run that ended without releasing it (%s)",
                        folder, left)
        _held[key] = [fd, 1]
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        text = f"{os.getpid()} {shlex.join(sys.argv)}\n".encode("utf-8", "replace")
        while text:  # a write may be short (a file-size limit): the next one says why
            text = text[os.write(fd, text):]
        yield
    finally:
        _held.pop(key, None)
        with suppress(FileNotFoundError):  # the folder itself may have been removed
            os.remove(path)  # while still held; see the module docstring
        os.close(fd)
