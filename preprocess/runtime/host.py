"""What the machine gives this process: its usable cores, the default number of workers, the
user's cache folder, and the process tree. One rule each, imported by the plugin,
preprocessing, the recipes and the benchmarks alike (two core counts written apart came to
disagree under a cgroup quota). The standard library only: ``convs2s-recipe --help`` imports
it, and must not import torch.
"""
import math
import os
from typing import Dict, List, Optional

CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (which a batch scheduler's CPU set
    limits), capped by a cgroup v2 CPU quota (``cpu.max``, a container's ``--cpus``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.floor(quota))) if quota else cores


def _cgroup_quota() -> Optional[float]:
    try:
        with open(CGROUP_CPU_MAX) as f:
            limit, period = f.read().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        return None


def default_workers(workers: Optional[int] = None) -> int:
    """The worker processes of a preprocessing stage: ``workers`` where given (``--workers``),
    else one per usable core."""
    return workers or usable_cores()


def cache_folder(name: str = "convs2s") -> str:
    """The user's cache folder ``name``: in ``$XDG_CACHE_HOME`` where set, else in
    ``~/.cache`` (the XDG base directory rule)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, name)


def _children() -> Dict[int, List[int]]:
    """{pid: [child pids]} of the live processes (not zombies), read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        state, ppid = stat[stat.rindex(b")") + 2:].split()[:2]
        if state != b"Z":
            children.setdefault(int(ppid), []).append(int(entry))
    return children


def descendants(pid: int) -> List[int]:
    """The live descendants of process ``pid``, each after its parent."""
    children, found, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
