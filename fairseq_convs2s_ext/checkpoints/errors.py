"""Why a checkpoint cannot or must not be used: the plugin's errors, and :func:`why_unreadable`,
which tells what a failure of ``torch.load`` means for the file. The plugin's commands report
them in one line, and so does :mod:`..excepthook` for fairseq's."""
import pickle
import re
from typing import Optional

# What torch.load raises for a file it cannot open; for one cut short, corrupt or of another kind.
_FILE_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError)
_READ_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError, KeyError, IndexError)
_BZIP2 = b"BZh"


class CheckpointError(Exception):
    """A checkpoint the plugin will not use; the message says why and what to do."""


class CheckpointRefused(CheckpointError):
    """A checkpoint whose configuration could run code."""


class DictionaryMismatch(CheckpointError):
    """A checkpoint used with dictionaries other than the ones it was trained with."""


class UnreadableCheckpoint(CheckpointError):
    """A file that cannot be read as a fairseq checkpoint; the message names it."""


def why_unreadable(exc: BaseException, path: str) -> Optional[str]:
    """``PATH: why, and what to do`` for ``exc`` raised by ``torch.load(path)``; None for an
    exception that says nothing about the file."""
    if isinstance(exc, CheckpointError):  # raised while unpickling (safe_loading.CheckedNamespace)
        return f"{path}: {exc}"
    unsafe_global = re.search(r"\bGLOBAL (\S+)", str(exc))
    if isinstance(exc, pickle.UnpicklingError) and unsafe_global:
        return (f"{path}: refused by torch's safe unpickler: it holds objects other than tensors and "
                f"fairseq's configuration, which could run code when loaded (GLOBAL {unsafe_global[1]})")
    if isinstance(exc, _FILE_ERRORS):
        return f"{path}: {exc.strerror}"
    if not isinstance(exc, _READ_ERRORS):
        return None
    if _starts_with(path, _BZIP2):
        return f"{path}: a bzip2 archive, not a checkpoint: extract it (tar xjf) and pass the model .pt inside"
    return (f"{path}: not a readable checkpoint ({_first_sentence(exc)}): it is corrupt or cut short (a "
            f"disk that filled up while it was written or copied), or not a PyTorch checkpoint: use "
            f"another copy, or another checkpoint of the run (checkpoint_last.pt, checkpointN.pt)")


def _starts_with(path: str, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _first_sentence(exc: BaseException) -> str:
    """What went wrong, without torch's paragraphs about ``weights_only`` around it."""
    text = str(exc).split("WeightsUnpickler error:")[-1].strip()
    return f"{type(exc).__name__}: {text.splitlines()[0].split('. ')[0]}" if text else type(exc).__name__
