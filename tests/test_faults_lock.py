"""Issue 34, item 3: one run at a time per output folder (convs2s_preprocess.runtime.locking), with
real processes: a second run into a folder stops at once with one line naming the first
run's pid; a lock left by a killed run is taken over."""
import os
import subprocess
import sys

import pytest

from conftest import BIN, ROOT
from convs2s_preprocess.runtime.locking import LOCK_NAME, FolderInUse, output_lock
from faults import wait_until

HOLD = "import sys, time; from convs2s_preprocess.runtime.locking import output_lock\n" \
       "with output_lock(sys.argv[1]):\n    print('locked', flush=True)\n    time.sleep(300)\n"


@pytest.fixture
def holder(tmp_path):
    """A process holding the lock of tmp_path/out, until the test ends."""
    folder = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), "--the-holder"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield folder, proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


def _raw(data_dir, folder, count=200):
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = (data_dir / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:count]
        (folder / f"train.{lang}").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return folder / "train"


def _commands(folder, raw):
    return {
        "convs2s-prepare": ["convs2s-prepare", "-s", "en", "-t", "de", "--trainpref", raw, "-o", folder,
                            "--bpe-merges", "50"],
        "convs2s-align-dict": ["convs2s-align-dict", "--src", f"{raw}.en", "--tgt", f"{raw}.de", "-o",
                               folder / "align.dict"],
        "convs2s-recipe": ["convs2s-recipe", "multi30k-demo", "--smoke", "--work", folder],
    }


@pytest.mark.parametrize("tool", ["convs2s-prepare", "convs2s-align-dict", "convs2s-recipe"])
def test_a_second_run_into_a_folder_stops_naming_the_first(holder, tool, tmp_path, data_dir):
    folder, proc = holder
    before = sorted(os.listdir(folder))
    argv = _commands(folder, _raw(data_dir, tmp_path / "raw"))[tool]
    done = subprocess.run([str(BIN / argv[0]), *map(str, argv[1:])], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{folder} is being written by another run (pid {proc.pid}: " in errors[0]
    assert "--the-holder" in errors[0]  # its command line
    assert sorted(os.listdir(folder)) == before  # nothing written, the holder's lock kept
    assert proc.poll() is None


def test_two_real_prepare_runs_one_stops_the_other_completes(tmp_path, data_dir):
    raw = _raw(data_dir, tmp_path / "raw", 2000)
    folder = tmp_path / "out"
    argv = [str(BIN / "convs2s-prepare"), "-s", "en", "-t", "de", "--trainpref", str(raw), "-o", str(folder),
            "--bpe-merges", "200"]
    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: (folder / LOCK_NAME).exists() and (folder / LOCK_NAME).stat().st_size, 60)
        second = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        still_running = first.poll() is None
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    assert still_running, "the first run ended before the second started: make the corpus larger"
    assert second.returncode == 1 and f"(pid {first.pid}: " in second.stderr, second.stderr
    assert not (folder / LOCK_NAME).exists()  # released by the first run


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, holder):
    folder, proc = holder
    proc.kill()  # SIGKILL: it cannot unlock, the kernel does
    proc.wait()
    assert (folder / LOCK_NAME).read_text().startswith(f"{proc.pid} ")
    with output_lock(folder):
        assert (folder / LOCK_NAME).read_text().startswith(f"{os.getpid()} ")
    assert not (folder / LOCK_NAME).exists()


def test_in_process_the_lock_is_reentrant_and_another_process_is_refused(tmp_path, holder):
    folder, proc = holder
    with pytest.raises(FolderInUse, match=f"pid {proc.pid}: "):
        with output_lock(folder):
            pass
    own = tmp_path / "own"
    with output_lock(own):
        with output_lock(own):  # a recipe holding its work folder writes align.dict into it
            pass
        assert (own / LOCK_NAME).exists()
        refused = subprocess.run([sys.executable, "-c", HOLD, str(own)], cwd=ROOT, capture_output=True, text=True)
        assert refused.returncode == 1 and f"(pid {os.getpid()}: " in refused.stderr
    assert not (own / LOCK_NAME).exists()
