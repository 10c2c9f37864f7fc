"""One training per ``--save-dir``.

Two trainings writing one folder (two seeds started with the same ``--save-dir``) rename their
checkpoints over each other's: fairseq writes ``checkpoint_2_60.pt.tmp`` and renames it, so one
run dies renaming a file the other already moved, and the folder ends with
``checkpoint_last.pt`` of one run beside ``checkpoint_N.pt`` of the other; with the same seed
both finish and nothing says so. So a training with the plugin's task takes the same lock on
its ``--save-dir`` as ``convs2s-prepare`` takes on its output folder
(:func:`convs2s_preprocess.runtime.locking.output_lock`: an exclusive ``flock`` on a file in the
folder, holding the run's pid and command line). The second run stops before it reads or
writes anything there, with one line naming the first; the lock of a run that was killed is
released by the kernel with its process and taken over by the next. Only the process of rank
0 takes it: the other ranks of a distributed training write no checkpoints. Holding it also
makes fairseq's copies of a checkpoint into the folder whole or nothing (:mod:`.whole_copies`).
"""
import atexit
from contextlib import ExitStack

from convs2s_preprocess.runtime.locking import FolderInUse, output_lock

from . import whole_copies
from .errors import CheckpointError

_held = ExitStack()
atexit.register(_held.close)


class SaveDirInUse(CheckpointError):
    """Another live training holds the ``--save-dir``."""


def hold(save_dir: str) -> None:
    """Hold ``save_dir``'s lock until this process ends, or raise :class:`SaveDirInUse`; from
    then on fairseq copies checkpoints whole (:mod:`.whole_copies`)."""
    try:
        _held.enter_context(output_lock(save_dir))
    except FolderInUse as e:
        raise SaveDirInUse(f"--save-dir {e}") from None
    whole_copies.install()
