"""Faults injected into real runs of the commands, for the tests of issue 34.

Each command runs as a subprocess of the test, on real data, in a folder of its own:

- :func:`kill_and_resume`: SIGKILL at seeded random moments, each time rerunning the same
  command in the same folder, then one run to the end; the folder must then hold what an
  uninterrupted run wrote (:class:`Case` says how two folders are compared), and no process
  started by the killed runs may be left.
- :func:`limited_run`: the command under ``RLIMIT_FSIZE`` (no file may grow past LIMIT bytes,
  a write past it fails with EFBIG; SIGXFSZ, which would kill instead, is ignored), which is a
  full disk at the write that crosses the limit, as far as the command can tell.
  :func:`failure_limits` steps the limit so that each file that can be the first to cross it
  is, once.

The seed is ``CONVS2S_FAULT_SEED`` if set, else drawn anew, and every failure message starts
with it, so a failure is reproduced by running the same test with that seed.
"""
import hashlib
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from conftest import BIN, ROOT

SEED_VARIABLE = "CONVS2S_FAULT_SEED"
WORK_FOLDER = ".align-work-"  # convs2s-align-dict's scratch folder
FLOOR = 64  # bytes: the smallest file-size limit tried (see failure_limits)
SEED = int(os.environ.get(SEED_VARIABLE) or random.SystemRandom().randrange(2**31))


def rng(name: str) -> random.Random:
    """A generator of moments for one test: the seed and the test's name decide them."""
    return random.Random(f"{SEED}:{name}")


def reproduce(test: str) -> str:
    """The start of a failure message: the seed, and the command that replays it."""
    return f"[{SEED_VARIABLE}={SEED} .venv/bin/pytest -m 'slow or not slow' 'tests/{test}']"


class Case(NamedTuple):
    """A command and how its result is judged."""
    name: str
    setup: Callable[[Path], None]  # writes the command's inputs into a fresh folder
    argv: list  # the command, run in that folder
    compare: Callable[[Path, Path], list]  # differences of a folder from the reference's


# One thread in every run: the thread count a command chooses by itself follows the load on
# the machine, and training's floating-point sums (compared bit for bit) follow the count.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def ctrl_c_as_a_terminal_sends_it() -> None:
    """A ``preexec_fn`` for a command a test interrupts with SIGINT: a test run started as a
    background job of a shell without job control (``cmd &`` in a script, nohup) inherits
    SIGINT ignored, and so would the command; put back its default, which Python turns into
    KeyboardInterrupt, as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def command(tool: str, *args) -> list:
    return [str(BIN / tool), *map(str, args)]


def run(argv: list, cwd: Path, file_size_limit: Optional[int] = None) -> subprocess.CompletedProcess:
    """Run to the end, output and errors captured through pipes (which no file-size limit
    reaches)."""
    return subprocess.run(argv, cwd=cwd, env=ENV, text=True, capture_output=True,
                          preexec_fn=None if file_size_limit is None else _limit(file_size_limit))


def _limit(size: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death; inherited
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return preexec


def processes_mentioning(text: str) -> list:
    """``pid: command line`` of the live processes whose command line or working folder
    holds ``text`` (a zombie has neither)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if (text.encode() in cmdline or text in cwd) and int(entry) != os.getpid():
            found.append(f"{entry}: " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def timed(case: Case, folder: Path) -> tuple:
    """Set up and run ``case`` to the end in ``folder`` (the reference): (its duration in
    seconds, the time it started, in ns since the epoch)."""
    case.setup(folder)
    started, started_ns = time.monotonic(), time.time_ns()
    done = run(case.argv, folder)
    assert done.returncode == 0, f"{case.name} failed:\n{done.stderr[-3000:]}"
    return time.monotonic() - started, started_ns


def kill_and_resume(case: Case, reference: Path, duration: float, folder: Path, kills: int,
                    moments: random.Random) -> list:
    """SIGKILL ``case`` ``kills`` times, each run started in ``folder`` as the last one left
    it, at a moment drawn in [0, ``duration``); then run it to the end. Returns what went
    wrong: a run that failed, a process left running, a difference from ``reference``."""
    case.setup(folder)
    problems, killed_at = [], []
    for kill in range(kills):
        moment = moments.uniform(0, duration)
        proc = subprocess.Popen(case.argv, cwd=folder, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            proc.wait(timeout=moment)
            if proc.returncode != 0:
                problems.append(f"run {kill + 1} (not killed) failed: {proc.stderr.read()[-2000:]}")
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed_at.append(moment)
        proc.stderr.close()
        if not wait_until(lambda: not processes_mentioning(str(folder)), 10):
            problems.append(f"left running after SIGKILL at {moment:.2f} s: "
                            f"{processes_mentioning(str(folder))}")
    done = run(case.argv, folder)
    if done.returncode != 0:
        problems.append(f"the run after {kills} kills failed: {done.stderr[-3000:]}")
    else:
        problems += case.compare(reference, folder)
    if problems:  # where the kills fell, to find the window again (they depend on the machine's speed)
        problems.append(f"killed at {', '.join(f'{m:.2f} s' for m in killed_at) or 'none (each run ended first)'}")
    return problems


def limited_run(case: Case, reference: Path, folder: Path, limit: int) -> tuple:
    """Run ``case`` in a fresh ``folder`` with files limited to ``limit`` bytes, then without.

    Returns (whether the limit stopped the run, what went wrong): a limited run that failed otherwise than with one line that
    says the disk is full; a file it left that ``reference`` (an unlimited run) holds with
    other bytes, or a temporary one; a rerun that failed or wrote other files than the
    reference's.
    """
    case.setup(folder)
    limited = run(case.argv, folder, file_size_limit=limit)
    problems = one_clear_line(limited) if limited.returncode != 0 else []
    left, complete = snapshot(folder), snapshot(reference)
    problems += [f"{name}: left with other bytes than an unlimited run's" for name, digest in left.items()
                 if name in complete and digest != complete[name] and not name.endswith(".built-from.json")]
    problems += [f"{name}: left behind" for name in left
                 if name.endswith(".tmp") or WORK_FOLDER in name]
    done = run(case.argv, folder)
    if done.returncode != 0:
        problems.append(f"the rerun without a limit failed: {done.stderr[-3000:]}")
    else:
        problems += case.compare(reference, folder)
    return limited.returncode != 0, [f"limit {limit} bytes: {problem}" for problem in problems]


def one_clear_line(done: subprocess.CompletedProcess) -> list:
    """What is wrong with the error output of a run stopped by a full disk (nothing: [])."""
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    if "Traceback" in done.stderr or len(errors) != 1:
        return [f"not one line of error:\n{done.stderr[-3000:]}"]
    if not re.search(r"File too large|No space left|disk", errors[0]):
        return [f"the error does not say the disk is full: {errors[0]}"]
    return []


def snapshot(folder: Path) -> dict:
    """{relative name: sha256} of every file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write_order(folder: Path, since_ns: int) -> list:
    """The sizes of the files under ``folder`` written since ``since_ns``, in the order they
    were last written."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.stat().st_mtime_ns >= since_ns]
    return [p.stat().st_size for p in sorted(files, key=lambda p: p.stat().st_mtime_ns)]


def failure_limits(order: list) -> list:
    """File-size limits at which each write that can be the first to cross the limit is:
    the largest size written before each file larger than all before it.

    None is below :data:`FLOOR`: RLIMIT_FSIZE limits every file, also the semaphores Python's
    multiprocessing creates in /dev/shm (a filesystem of its own, which a full disk leaves
    alone) when fairseq is imported."""
    limits, largest = [], FLOOR
    for size in order:
        if size > largest:
            limits.append(largest)
            largest = size
    return limits


def same_files(reference: Path, folder: Path, records: bool = True) -> list:
    """Differences between two folders: file names (hidden ones too), then contents. The
    ``.built-from.json`` records hold inodes and times: they are compared without them,
    and with each folder's own path replaced."""
    a, b = snapshot(reference), snapshot(folder)
    problems = [f"{name}: only in the reference" for name in sorted(a.keys() - b.keys())]
    problems += [f"{name}: not in the reference" for name in sorted(b.keys() - a.keys())]
    for name in sorted(a.keys() & b.keys()):
        if name.endswith(".built-from.json"):
            if records and _record(reference / name, reference) != _record(folder / name, folder):
                problems.append(f"{name}: another record")
        elif a[name] != b[name]:
            problems.append(f"{name}: other bytes")
    return problems


def _record(path: Path, folder: Path):
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "stat"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value.replace(str(folder), "FOLDER") if isinstance(value, str) else value
    return strip(json.loads(path.read_text()))

