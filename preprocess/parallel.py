"""Line-by-line stages on every core, in order, in bounded memory, with progress.

Tokenizing, applying BPE and counting words treat each line on its own, so a corpus is
cut into batches of lines that worker processes handle while this process reads the next
ones and writes the finished ones in their order. Batches, not single lines, go to the
workers, so that the cost of handing work over is paid once per thousands of lines. At
most a few batches per worker are in flight: memory does not grow with the corpus
(``multiprocessing.Pool.imap`` would read the whole input ahead into its queue).

``--workers`` defaults to :func:`available_cores`: the cores this process may run on
(``os.sched_getaffinity``, which a batch scheduler's CPU set limits), not the machine's.
"""
import collections
import functools
import itertools
import multiprocessing
import os
from typing import Callable, Iterable, Iterator, List, Optional

from .progress import Progress
from .textio import count_lines, read_lines

# Lines handed to a worker at a time.
BATCH_LINES = 5000
# Batches in flight per worker: enough that no worker waits for the next one.
IN_FLIGHT_PER_WORKER = 3


def available_cores() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def batched(items: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of ``size`` items (the last one shorter)."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _context():
    """Forked workers: they share what this process holds (the aligner's table), which
    Python 3.14's default on Linux, forkserver, would not give them."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def map_batches(fn: Callable[[list], object], batches: Iterable[list], workers: int) -> Iterator:
    """``fn(batch)`` for every batch, in order, computed by ``workers`` processes.

    ``fn`` must be picklable (a module-level function or a ``functools.partial`` of one).
    """
    if workers <= 1:
        yield from map(fn, batches)
        return
    with _context().Pool(workers) as pool:
        pending = collections.deque()
        for batch in batches:
            pending.append(pool.apply_async(fn, (batch,)))
            if len(pending) >= IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _map_lines(fn: Callable[[str], str], lines: List[str]) -> List[str]:
    return [fn(line) for line in lines]


def map_file(fn: Callable[[str], str], in_path: str, out_path: str, workers: int = 1,
             stage: Optional[str] = None) -> int:
    """Write ``fn(line)`` for every line of ``in_path`` to ``out_path``, in order, ``fn``
    applied in ``workers`` processes; return the number of lines. Logs ``stage``'s progress
    in lines."""
    progress = Progress(stage or f"{os.path.basename(in_path)} -> {out_path}",
                        count_lines(in_path), unit="lines")
    batch_fn = functools.partial(_map_lines, fn)
    with open(out_path, "w", encoding="utf-8", newline="\n") as out:
        for result in map_batches(batch_fn, batched(read_lines(in_path), BATCH_LINES), workers):
            out.write("".join(line + "\n" for line in result))
            progress.update(len(result))
    progress.finish()
    return progress.done
