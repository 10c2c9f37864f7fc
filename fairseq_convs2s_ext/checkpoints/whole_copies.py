"""fairseq-train's copies of a checkpoint written whole or not at all.

fairseq-train writes each save once, atomically (``checkpoint_N.pt.tmp``, then renamed), and
then copies it to the other names it is saved under (``checkpoint_last.pt``,
``checkpoint_best.pt``, ...) with ``shutil.copyfile``, which writes over the destination in
place: a training killed during that copy (preempted, stopped at a job's time limit) or whose
disk filled up leaves ``checkpoint_last.pt`` cut short where an intact one was, and the next
run, which resumes from it, stops (:mod:`.integrity` refuses it). While a training holds its
``--save-dir`` (:mod:`.save_dir_lock` installs this), fairseq's copies to local paths are
written under a hidden temporary name beside the destination and renamed over it once
complete (:func:`convs2s_preprocess.runtime.atomic.atomic_outputs`: the folder's lock makes its
fixed temporary name safe, and the next copy deletes one a killed copy left), so the
destination holds the old checkpoint or the new one. The copy needs room for one more
checkpoint while it runs. Copies to remote paths (fairseq's ioPath handlers) stay fairseq's.
"""
from convs2s_preprocess.runtime.atomic import atomic_outputs


def install() -> None:
    """Make ``fairseq.file_io.PathManager.copy``, which fairseq's ``save_checkpoint`` calls,
    atomic for local destinations; calling it again changes nothing."""
    from fairseq.file_io import PathManager

    fairseq_copy = PathManager.copy
    if getattr(fairseq_copy, "whole", False):
        return

    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(dst_path):
            return fairseq_copy(src_path, dst_path, overwrite=overwrite)
        with atomic_outputs([dst_path]) as (temp,):
            fairseq_copy(src_path, temp, overwrite=True)
        return True

    copy.whole = True
    PathManager.copy = staticmethod(copy)
