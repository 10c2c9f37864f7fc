"""One training per --save-dir: a second fairseq-train with the plugin's task into a folder that a
live training writes stops at once with one line naming the first; a killed training's lock is
taken over. Before, two seeds into one folder ended with one run's checkpoint_last.pt beside the
other's checkpoint_N.pt, or one died renaming checkpoint_N.pt.tmp. A training that holds its folder
copies checkpoints whole: before, a kill or a full disk during fairseq's copy of a save to
checkpoint_last.pt left it cut short, and the resumed run stopped (a CI run of the test below)."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import BIN, ROOT
from convs2s_preprocess.runtime.locking import LOCK_NAME
from faults import wait_until

BOUND = 120  # seconds any of these trainings may take to start, refuse or finish on 2 busy cores


def training(data_bin, save_dir, seed, updates):
    return [str(BIN / "fairseq-train"), str(data_bin), "--user-dir", str(ROOT / "fairseq_convs2s_ext"),
            "--task", "convs2s_translation", "--arch", "convs2s_tiny", "--optimizer", "nag", "--lr", "0.25",
            "--momentum", "0.99", "--clip-norm", "0.1",
            "--criterion", "convs2s_cross_entropy", "--max-tokens", "1000", "--save-dir", str(save_dir),
            "--max-update", str(updates), "--seed", str(seed), "--disable-validation", "--num-workers", "0",
            "--no-progress-bar"]


def test_a_second_training_into_a_save_dir_stops_and_a_killed_ones_lock_is_taken_over(small_bin, tmp_path):
    save_dir = tmp_path / "checkpoints"
    first = subprocess.Popen(training(small_bin, save_dir, 1, 100_000), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: (save_dir / LOCK_NAME).exists(), BOUND), "the first training took no lock"
        second = subprocess.run(training(small_bin, save_dir, 2, 5), capture_output=True, text=True, timeout=BOUND)
        assert second.returncode != 0 and "Traceback" not in second.stderr, second.stderr[-3000:]
        errors = [line for line in second.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and f"--save-dir {save_dir} is being written by another run" in errors[0]
        assert f"pid {first.pid}" in errors[0]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=BOUND)
    third = subprocess.run(training(small_bin, save_dir, 3, 3), capture_output=True, text=True, timeout=BOUND)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "taking over the lock of a run that ended without releasing it" in third.stdout + third.stderr
    assert (save_dir / "checkpoint_last.pt").exists() and not (save_dir / LOCK_NAME).exists()


COPY = textwrap.dedent("""
    import resource, signal, sys
    from fairseq import checkpoint_utils
    from fairseq_convs2s_ext.checkpoints import save_dir_lock
    save_dir, new, last, fault = sys.argv[1:]
    save_dir_lock.hold(save_dir)
    if fault != "none":  # no file may grow past 2 MiB: the kernel kills the writer, or its write fails
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL if fault == "killed" else signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
    checkpoint_utils.PathManager.copy(new, last, overwrite=True)  # as fairseq's save_checkpoint does
""")


@pytest.mark.parametrize("fault", ["killed", "disk full"])
def test_a_copy_to_checkpoint_last_cut_short_leaves_the_old_one(tmp_path, fault):
    new, last = tmp_path / "checkpoint7.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(os.urandom(8 << 20))
    old = os.urandom(1 << 20)
    last.write_bytes(old)
    copying = [sys.executable, "-c", COPY, str(tmp_path), str(new), str(last)]
    cut = subprocess.run(copying + [fault], capture_output=True, text=True, timeout=BOUND)
    if fault == "killed":
        assert cut.returncode == -signal.SIGXFSZ, cut.stderr[-3000:]
    else:
        assert cut.returncode == 1 and "File too large" in cut.stderr, cut.stderr[-3000:]
    assert last.read_bytes() == old, "checkpoint_last.pt was written in place"
    done = subprocess.run(copying + ["none"], capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0, done.stderr[-3000:]
    assert last.read_bytes() == new.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [new.name, last.name]  # no temporary file left
