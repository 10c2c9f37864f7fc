"""How many threads torch's CPU operations use: as many as there are idle cores, not more.

torch starts one OpenMP thread per core it sees. Where other programs already keep some of
those cores busy (a shared machine, a second job), the threads wait on each other at every
operation's barrier: on a busy 2-core machine training ran 6x slower with torch's default
than with one thread (0.2 against 1.2 updates/s), and fairseq-generate 11x slower (180.6 s
against 16.0 s). So the plugin's commands (fairseq's commands with the plugin loaded, see
:func:`apply_to_command`) and the recipes choose the count themselves (:func:`choose`):

- ``OMP_NUM_THREADS`` when the user set it, always (torch and OpenMP read it too);
- else the cores this process may use (its CPU affinity, capped by a cgroup CPU quota) that
  were idle over a short look at ``/proc/stat`` before the command started, at least one;
- where that look is impossible (not Linux), the cores it may use.

A program that imports the plugin as a library (the hub) keeps the threads it set with
``torch.set_num_threads``: the choice is made for commands only. The recipes hand their count
to the fairseq commands they start as ``OMP_NUM_THREADS`` (:func:`environment`), so that
their child processes use the same count instead of looking again while the recipe's own
work keeps the cores busy.
"""
import logging
import os
import time
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from convs2s_preprocess.runtime.host import usable_cores

logger = logging.getLogger(__name__)

ENV = "OMP_NUM_THREADS"
LOOK_SECONDS = 0.2  # how long the idle cores are measured: /proc/stat counts in 1/100 s


@dataclass(frozen=True)
class Threads:
    count: int
    why: str  # for the user: where the count comes from, and how to change it


def _cpu_times() -> Dict[int, tuple]:
    """{cpu number: (idle, total)} jiffies from /proc/stat."""
    times = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
                times[int(name[3:])] = (values[3] + values[4], sum(values))
    return times


def idle_cores(seconds: float = LOOK_SECONDS) -> Optional[float]:
    """How many of this process's cores were idle over the next ``seconds`` (0.0 to their
    number), from the kernel's counts in /proc/stat; None where there are none to read."""
    try:
        cpus = os.sched_getaffinity(0)
        before = _cpu_times()
        time.sleep(seconds)
        after = _cpu_times()
    except (AttributeError, OSError, ValueError):
        return None
    idle = 0.0
    for cpu in cpus:
        if cpu in before and cpu in after:
            total = after[cpu][1] - before[cpu][1]
            idle += (after[cpu][0] - before[cpu][0]) / total if total > 0 else 1.0
    return idle


def choose(environ: Mapping[str, str], cores: int, idle: Optional[float]) -> Threads:
    """The thread count for ``cores`` usable cores of which ``idle`` are idle (None: not
    known); ``environ[OMP_NUM_THREADS]``, a positive whole number, decides when set."""
    value = environ.get(ENV, "").strip()
    if value:
        if value.isdigit() and int(value) > 0:
            return Threads(int(value), f"{ENV}={value}")
        logger.warning("%s=%r is not a positive whole number: ignored", ENV, value)
    if idle is None:
        return Threads(cores, f"the {cores} usable cores; set {ENV} to choose")
    count = max(1, min(cores, int(idle + 0.5)))
    return Threads(count, f"{idle:.1f} of the {cores} usable cores were idle; set {ENV} to choose")


def current() -> Threads:
    """The choice for this process now (measures the idle cores unless OMP_NUM_THREADS is set)."""
    if os.environ.get(ENV, "").strip():
        return choose(os.environ, usable_cores(), None)
    return choose(os.environ, usable_cores(), idle_cores())


def apply(threads: Threads) -> Threads:
    """Make torch's CPU operations use ``threads.count`` threads; log the choice and why."""
    import torch

    torch.set_num_threads(threads.count)
    logger.info("using %d CPU thread%s (%s)", threads.count, "" if threads.count == 1 else "s", threads.why)
    return threads


def apply_to_command() -> Threads:
    """For a command's process: choose and apply (see the module's docstring)."""
    return apply(current())


def environment(threads: Threads, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``base`` (default: this process's environment) with OMP_NUM_THREADS set to the count:
    the environment of a child process that is to use the same threads."""
    return {**(os.environ if base is None else base), ENV: str(threads.count)}
