"""Whether a checkpoint's bytes are the ones torch wrote, checked before it is used.

torch saves a checkpoint as a zip archive whose directory holds a CRC-32 of every member,
but its reader never checks them: bytes changed on disk (a bad sector, a bit flip in a copy)
load without complaint, and training resumes, or a model translates, with weights nobody
trained. A file cut short (a full disk, an interrupted copy) has no zip directory, and
torch's error names neither the file nor what to do. :func:`verify_container` reads the
archive through :mod:`zipfile`, which checks every member's CRC, and names the damage and the
newest intact checkpoint beside it (:func:`newest_intact`). The cost is one read of the file
(docs/safety.md has the figure for a 1 GB checkpoint), paid by every path that uses one:
resuming, fairseq-generate, fairseq-interactive, the hub, averaging and importing.

Checkpoints in torch's legacy format (before 1.6, the released fconv models among them)
carry no checksums; they are read as they are.
"""
import os
import zipfile
from typing import Optional

from .errors import UnreadableCheckpoint

_ZIP = b"PK\x03\x04"
_CHUNK = 1 << 22


def damage(path: str) -> Optional[str]:
    """What is wrong with the container of the checkpoint at ``path``, or None if nothing is
    (or it is in torch's legacy format, which has no checksums)."""
    with open(path, "rb") as f:
        if f.read(len(_ZIP)) != _ZIP:
            return None
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                with archive.open(member) as data:  # zipfile raises BadZipFile on a CRC mismatch
                    while data.read(_CHUNK):
                        pass
    except zipfile.BadZipFile as e:
        if "CRC" in str(e):
            return f"damaged: the bytes of {str(e).split()[-1]} differ from those torch wrote (their CRC-32 fails)"
        return "cut short or damaged: its zip directory cannot be read (a disk that filled up, or a copy that stopped)"
    except (EOFError, OSError) as e:
        return f"cut short or damaged: {e}"
    return None


def newest_intact(folder: str, besides: str) -> Optional[str]:
    """The newest ``*.pt`` of ``folder`` other than ``besides`` whose container is intact."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".pt")]
    except OSError:
        return None
    candidates = [os.path.join(folder, n) for n in names]
    candidates = [p for p in candidates if os.path.isfile(p) and not os.path.samefile(p, besides)]
    for path in sorted(candidates, key=os.path.getmtime, reverse=True):
        try:
            if damage(path) is None:
                return path
        except OSError:
            continue
    return None


def instead(path: str) -> str:
    """What to use instead of the unusable checkpoint at ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    other = newest_intact(folder, path) if os.path.exists(path) else None
    if other is None:
        return f"no intact checkpoint is beside it in {folder}: use another copy"
    return f"the newest intact checkpoint beside it is {other}"


def verify_container(path: str) -> None:
    """Raise :class:`UnreadableCheckpoint` naming the file, the damage and what to use instead."""
    problem = damage(path)
    if problem is not None:
        raise UnreadableCheckpoint(f"{path}: {problem}; {instead(path)}")
