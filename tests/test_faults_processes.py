"""Issue 34, item 6: SIGKILL of convs2s-align-dict leaves no aligner process running, with
eflomal (eflomal-align runs an `eflomal` binary of its own) and with a fast_align binary
that starts a process of its own in a session of its own. Real processes; /proc is read."""
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import BIN, ROOT
from convs2s_preprocess.stages.align import WORK_PREFIX
from faults import processes_mentioning, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
EFLOMAL = shutil.which("eflomal-align", path=str(BIN))


def _corpus(data_dir, folder, lines=None):
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        text = (data_dir / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:lines]
        (folder / f"train.{lang}").write_text("".join(f"{line}\n" for line in text), encoding="utf-8")
    return folder / "train.en", folder / "train.de"


def _kill_while_aligning(tmp_path, src, tgt, *options, running, seen=""):
    """Start convs2s-align-dict, SIGKILL it once ``running`` processes mention its work
    folder (one of them mentioning ``seen``), and return those processes and those still
    running 10 s later."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([str(BIN / "convs2s-align-dict"), "--src", src, "--tgt", tgt, "-o", out / "align.dict",
                             *map(str, options)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = str(out / WORK_PREFIX)
    try:
        def working():
            aligners = processes_mentioning(marker)
            return len(aligners) >= running and any(seen in line for line in aligners)

        started = wait_until(lambda: working() or proc.poll() is not None, 120)
        assert started and proc.poll() is None, \
            f"the aligner did not start: {proc.stderr.read().decode() if proc.poll() is not None else 'timeout'}"
        aligners = processes_mentioning(marker)
        proc.kill()
        proc.wait()
    finally:
        proc.stderr.close()
    wait_until(lambda: not processes_mentioning(marker), 10)
    return aligners, processes_mentioning(marker)


@pytest.mark.skipif(EFLOMAL is None, reason="eflomal-align not installed (pip install eflomal)")
def test_sigkill_stops_eflomal_and_its_binary(tmp_path, data_dir):
    src, tgt = _corpus(data_dir, tmp_path / "data")
    # the guardian, eflomal-align and the eflomal binary it runs
    before, after = _kill_while_aligning(tmp_path, src, tgt, "--aligner", "eflomal", running=3)
    assert any("eflomal-align" not in line and "eflomal" in line for line in before), before
    assert not after, f"left running after SIGKILL of convs2s-align-dict: {after}"


def test_sigkill_stops_a_fast_align_binary_and_what_it_started(tmp_path, data_dir):
    """A stand-in fast_align that starts a child in a new session (escaping the process
    group) and waits: the child is a descendant all the same, and is killed."""
    fake = tmp_path / "fast_align"
    fake.write_text(f'#!/bin/sh\nsetsid "{sys.executable}" -c "import time; time.sleep(300)" "$@" &\nwait\n')
    fake.chmod(0o755)
    src, tgt = _corpus(data_dir, tmp_path / "data", 100)
    before, after = _kill_while_aligning(tmp_path, src, tgt, "--fast-align", fake, running=3, seen="time.sleep")
    assert any("time.sleep" in line for line in before), before
    assert not after, f"left running after SIGKILL of convs2s-align-dict: {after}"


def test_the_guardian_returns_the_exit_status_and_leaves_no_descendant(tmp_path):
    """A command that ends leaving a background process: the guardian reports its status and
    kills what it left."""
    marker = str(tmp_path / "left-behind")
    script = f'"{sys.executable}" -c "import time; time.sleep(300)" {marker} & exit 3'
    proc = subprocess.run([sys.executable, "-m", "convs2s_preprocess.runtime.processes", str(os.getpid()), "--",
                           "sh", "-c", script], cwd=ROOT, timeout=60)
    assert proc.returncode == 3
    assert wait_until(lambda: not processes_mentioning(marker), 10), processes_mentioning(marker)


def test_the_guardian_of_a_dead_parent_starts_nothing(tmp_path):
    marker = str(tmp_path / "never-started")
    proc = subprocess.run([sys.executable, "-m", "convs2s_preprocess.runtime.processes", "1", "--",
                           sys.executable, "-c", "import time; time.sleep(300)", marker], cwd=ROOT, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not processes_mentioning(marker)


def test_sigkill_of_a_recipe_stops_its_fairseq_generate(tmp_path):
    """The recipe's generation step runs fairseq-generate as a child process: a SIGKILL of
    the recipe stops it too (here a stand-in command in its place, that would sleep on)."""
    marker = str(tmp_path / "generating")
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    script = f"""
import os, sys
from convs2s_recipes import run
run.generate_command = lambda *args, **kwargs: (
    [sys.executable, "-c", "import time; time.sleep(300)", os.environ["MARKER"]], dict(os.environ, OMP_NUM_THREADS="1"))
run.generate(run.RECIPES["multi30k-demo"], "data-bin", {str(tmp_path / "checkpoint.pt")!r}, {str(tmp_path)!r}, None)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env={**os.environ, "MARKER": marker})
    try:
        assert wait_until(lambda: processes_mentioning(marker) or proc.poll() is not None, 60)
        assert proc.poll() is None, "the recipe's generation step ended before it was killed"
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not processes_mentioning(marker), 10), \
        f"left running after SIGKILL of the recipe: {processes_mentioning(marker)}"


def test_pool_workers_leave_ctrl_c_to_the_command_and_die_of_sigterm():
    """The workers of a command that turns SIGTERM into cleanup (exit_on_sigterm) ignore
    Ctrl-C, which the command answers, die of SIGTERM by the kernel's default action, and
    start with neither signal blocked: a worker that kept the inherited Python handler could
    lose a SIGTERM sent while it started, and Pool.terminate then waited for ever (seen on a
    rerun of convs2s-prepare); runtime blocks both across the fork until they are reset."""
    from convs2s_preprocess.runtime.processes import exit_on_sigterm
    from convs2s_preprocess.runtime.pool import worker_pool
    before = signal.getsignal(signal.SIGTERM)
    exit_on_sigterm()
    try:
        with worker_pool(2) as pool:
            dispositions = [pool.submit(signal.getsignal, sig).result() for sig in (signal.SIGINT, signal.SIGTERM)]
            blocked = pool.submit(signal.pthread_sigmask, signal.SIG_BLOCK, []).result()
        assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}
    finally:
        signal.signal(signal.SIGTERM, before)
    assert dispositions == [signal.SIG_IGN, signal.SIG_DFL]
    assert not blocked & {signal.SIGINT, signal.SIGTERM}
