"""Issue 54, item 2: every parallel stage ends, whatever the load and whenever a signal comes.

``convs2s-prepare`` once waited for ever on a busy machine: a pool that ended soon after it
started stopped its workers with SIGTERM, a worker that was still starting lost the signal,
and the pool waited for that worker (preprocess/runtime/pool.py's docstring). Here the parallel
stages run many times on tiny inputs with 2 to 4 workers while a CPU hog keeps every core
busy (so that workers start slowly), and SIGTERM (a batch scheduler's, to the command) or
SIGINT (Ctrl-C's, to its whole process group) comes at a random moment: anywhere in the run
once it logs, or in the first milliseconds after a new worker process appeared. Each run must end within
:data:`BOUND` seconds: finished, or stopped with no traceback and at most one line besides
the log (for Ctrl-C, the line that says it was interrupted), and leave no process behind.
Subprocess timeouts bound every wait, so the test itself cannot hang.

The moments are drawn from the seed of ``tests/faults.py`` (``CONVS2S_FAULT_SEED``, printed
with a failure): the default suite runs one of each stage, ``-m slow`` :data:`SLOW_RUNS`.
"""
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import DATA
from faults import ENV, ctrl_c_as_a_terminal_sends_it, processes_mentioning, reproduce, rng, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's signals and /proc")
MULTI30K = DATA / "multi30k"
needs_data = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found under {DATA}")

# Seconds a run may take, from its start to its end, on the loaded machine: a run that
# finishes takes some 3 to 15 (the import of fairseq for binarizing is most of it). Longer
# is a hang.
BOUND = 90
# Seconds the processes of a run that ended may take to be gone.
GONE_SECONDS = 10
SLOW_RUNS = 300
PAIRS = 200
# A line of the commands' log ("%(asctime)s | %(message)s"); any other line of stderr is
# an error, a warning or a traceback.
LOG_LINE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \| "

# A stage alone, as a command's main runs it: SIGTERM raises SystemExit, an interruption
# and a PreprocessError are one line.
DRIVER = """
import logging, sys
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.runtime.processes import exit_on_sigterm
logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s")
exit_on_sigterm()
logging.info("started")
try:
    {stage}
except PreprocessError as exc:
    sys.exit(f"error: {{exc}}")
except KeyboardInterrupt:
    sys.exit("interrupted")
"""
STAGES = {
    "binarize": "from convs2s_preprocess.stages.binarize import binarize; "
                "binarize('bin', 'en', 'de', trainpref='train', validpref='valid', workers={workers})",
    # shards of 50 words: the merges are learned in the workers too
    "bpe": "from convs2s_preprocess.stages import bpe; bpe.SHARD_WORDS = 50; "
           "bpe.learn_joint_bpe(['train.en', 'train.de'], 'codes', 300, {workers}); "
           "bpe.apply_bpe_file('codes', 'train.en', 'train.bpe.en', {workers})",
}


def _argv(stage: str, workers: int, align: bool) -> list:
    if stage == "prepare":
        return [sys.executable, "-m", "convs2s_preprocess.pipeline", "-s", "en", "-t", "de",
                "--trainpref", "train", "--validpref", "valid", "-o", "out", "--bpe-merges", "100",
                "--workers", str(workers), *(["--align-dict"] if align else [])]
    if stage == "align-dict":
        return [sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", "train.en", "--tgt",
                "train.de", "-o", "align.dict", "--aligner", "builtin", "--workers", str(workers)]
    return [sys.executable, "-c", DRIVER.format(stage=STAGES[stage].format(workers=workers))]


def _write_inputs(folder: Path) -> None:
    folder.mkdir()
    for lang in ("en", "de"):
        lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / f"train.{lang}").write_text("".join(lines[:PAIRS]), encoding="utf-8")
        (folder / f"valid.{lang}").write_text("".join(lines[PAIRS:PAIRS + 20]), encoding="utf-8")


def _children(pid: int) -> set:
    """The command's child processes now (its workers, and beside's process), read from the
    kernel's list of them: a few microseconds, where a scan of /proc takes milliseconds."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return set(f.read().split())
    except OSError:  # ended
        return set()


def _signal_at(proc: subprocess.Popen, plan: tuple, logging: threading.Event) -> str:
    """Send the planned signal at the planned moment, if the run has not ended; what was done.
    Moments count from the command's first log line (``logging``): before it, Python is
    still importing, and a signal then is Python's to report, not the command's."""
    sig, moment, value, delay = plan
    if moment == "after a new worker":  # the value-th child of the command, then delay s
        seen, deadline = set(), time.monotonic() + BOUND
        while len(seen) < value and proc.poll() is None and time.monotonic() < deadline:
            seen |= _children(proc.pid)
        time.sleep(delay)
    else:  # value seconds after the first log line
        logging.wait(BOUND)
        try:
            proc.wait(timeout=value)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is not None:
        return f"{sig.name} planned {moment} ({value}), but the run had ended"
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole process group
    else:
        os.kill(proc.pid, sig)
    return f"{sig.name} {moment} ({value})"


def _problems(proc: subprocess.Popen, stderr: str, sig) -> list:
    """What is wrong with how a run ended (nothing: [])."""
    others = [line for line in stderr.splitlines() if not re.match(LOG_LINE, line)]
    problems = []
    if "Traceback" in stderr or len(others) > 1:
        problems.append(f"not one line: {others[-12:]}")
    allowed = {0, 1 if sig == signal.SIGINT else 128 + signal.SIGTERM} if sig else {0}
    if proc.returncode not in allowed:
        problems.append(f"exit status {proc.returncode}: {others[-3:]}")
    if proc.returncode == 1 and sig == signal.SIGINT and not (others and others[-1].startswith("interrupted")):
        problems.append(f"an interrupted run's last line: {others[-1:]}")
    return problems


def _run(folder: Path, stage: str, workers: int, align: bool, plan: tuple) -> list:
    """One run of ``stage`` in ``folder`` (made with the inputs) with ``plan``'s signal
    (None: none); what went wrong, each problem naming the run."""
    _write_inputs(folder)
    started = time.monotonic()
    proc = subprocess.Popen(_argv(stage, workers, align), cwd=folder, env=ENV, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_as_a_terminal_sends_it)
    output, logging = [], threading.Event()  # stderr, read meanwhile: a full pipe would stop the command

    def read() -> None:
        for line in proc.stderr:
            output.append(line)
            logging.set()
        logging.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done = _signal_at(proc, plan, logging) if plan else "no signal"
    sig = plan[0] if plan and "had ended" not in done else None
    try:
        proc.wait(timeout=max(1.0, BOUND - (time.monotonic() - started)))
        reader.join(GONE_SECONDS)
        problems = _problems(proc, "".join(output), sig)
    except subprocess.TimeoutExpired:
        problems = [f"did not end within {BOUND} s: {processes_mentioning(str(folder))}"]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if not wait_until(lambda: not processes_mentioning(str(folder)), GONE_SECONDS):
        problems.append(f"left running: {processes_mentioning(str(folder))}")
        for line in processes_mentioning(str(folder)):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    return [f"{stage} --workers {workers}{' --align-dict' if align else ''}, {done}, "
            f"{time.monotonic() - started:.1f} s: {problem}" for problem in problems]


def _plans(name: str, runs: int) -> list:
    """(stage, workers, align, signal plan) of ``runs`` runs, every stage in turn."""
    moments = rng(name)
    plans = []
    for stage in itertools.islice(itertools.cycle(["bpe", "align-dict", "binarize", "prepare"]), runs):
        sig = moments.choice([None, signal.SIGTERM, signal.SIGINT, signal.SIGINT])
        if sig is None:
            plan = None
        elif moments.random() < 0.5:
            plan = (sig, "after a new worker", moments.randint(1, 8), moments.uniform(0, 0.005))
        else:
            plan = (sig, "after the first log line", round(moments.uniform(0, 6.0), 2), 0)
        plans.append((stage, moments.randint(2, 4), stage == "prepare" and moments.random() < 0.5, plan))
    return plans


@pytest.fixture
def cpu_hog():
    """A busy loop on every core the machine has, for the test's duration."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _many_runs(name: str, runs: int, tmp_path: Path) -> None:
    problems = []
    for number, (stage, workers, align, plan) in enumerate(_plans(name, runs)):
        problems += _run(tmp_path / f"run{number}", stage, workers, align, plan)
    assert not problems, f"{reproduce('test_runtime_hang.py')}\n" + "\n".join(problems)


@needs_data
def test_each_parallel_stage_ends_under_load_whenever_a_signal_comes(tmp_path, cpu_hog):
    """One run of each stage (bpe, align-dict, binarize, prepare), a signal drawn for each."""
    _many_runs("few", 4, tmp_path)


@pytest.mark.slow
@needs_data
def test_many_runs_of_the_parallel_stages_end_under_load(tmp_path, cpu_hog):
    _many_runs("many", SLOW_RUNS, tmp_path)
