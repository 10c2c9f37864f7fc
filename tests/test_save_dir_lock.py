"""One training per --save-dir: a second fairseq-train with the plugin's task into a folder that a
live training writes stops at once with one line naming the first; a killed training's lock is
taken over. Before, two seeds into one folder ended with one run's checkpoint_last.pt beside the
other's checkpoint_N.pt, or one died renaming checkpoint_N.pt.tmp."""
import signal
import subprocess

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
