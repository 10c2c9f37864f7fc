"""Progress of a long stage as log lines: done, rate, and an estimate of the time left.

A stage of ``convs2s-prepare`` or ``convs2s-align-dict`` on WMT-sized data runs for minutes
to hours; silence for that long looks like a hang. :class:`Progress` logs one line at most
every ``interval`` seconds (10, or ``CONVS2S_PROGRESS_SECONDS`` from the environment), and
one when a stage that logged progress ends::

    learn BPE: 12,000/40,000 merges (30%), 610 merges/s, about 0:00:46 left

A stage over within ``interval`` logs its final line at the debug level only: the step
around it says what it wrote, and a few thousand lines need no progress report (a 3,000-line
corpus gave 49 log lines, 20 of them ``100% ... in 0:00:00``). A stage that stops before its
total (learning BPE when no pair is frequent enough) ends on what it did, with no time left.

Plain log lines, never carriage-return bars, so that a log written to a file stays one
readable line per report (a progress bar's redraws would be one line of thousands).

The time left supposes that the time taken grows as a power of the work done, fitted on
the second half of what is done so far (:meth:`Progress.seconds_left`): for a stage that runs
at a steady rate, the power is 1 and the estimate the rate's; for one that speeds up, it is
smaller. Learning BPE speeds up (its first merges touch millions of words, its last a few):
on 36,000,000 built pairs, at 3% of its 40,000 merges, the rate so far said 4 h 26 min
left, the fit 14 min, and 5.4 were left (at 9%: 1 h 45 min, 5.3 min and 3.6). For a stage
that slows down the power is held at 1, the rate's estimate (a pause after a quick start
would otherwise put the end ages away).

:func:`watching` follows the progress that other code writes to a file of its own.
"""
import bisect
import contextlib
import datetime
import logging
import math
import os
import re
import threading
import time
from typing import Callable, Iterator, Optional

logger = logging.getLogger(__name__)

# Seconds between two progress lines of one stage (the environment may say otherwise).
INTERVAL_VARIABLE = "CONVS2S_PROGRESS_SECONDS"
try:
    INTERVAL = max(0.0, float(os.environ.get(INTERVAL_VARIABLE, 10)))
except ValueError:  # not a number: the default
    INTERVAL = 10.0
# Seconds between two looks at a file that another process writes its progress to.
POLL = min(1.0, max(INTERVAL, 0.05))
# A log line as the commands write it (``logging.basicConfig``'s format in their main).
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \| (.*)$", re.MULTILINE)


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class Progress:
    """Counts what a stage has done and logs it at intervals.

    ``total`` may be unknown (None): the lines then give the count and the rate only.
    Work that an interrupted run finished (:meth:`resume`) counts as done, not in the rate.
    """

    def __init__(self, stage: str, total: Optional[int] = None, unit: str = "pairs",
                 interval: Optional[float] = None, log: logging.Logger = logger):
        self.stage, self.total, self.unit = stage, total, unit
        self.interval = INTERVAL if interval is None else interval
        self.log = log
        self.done = self.resumed = 0
        self.start = self.last = time.monotonic()
        # (work done in this run, seconds since the start) at each line logged: the fit's points
        self.work, self.seconds = [0], [0.0]

    def seconds_left(self, elapsed: float) -> Optional[float]:
        """The seconds left at ``elapsed`` seconds, by the power of the work done that takes
        the time from the last line logged at half the work done or less to now (before such a
        line, at the rate so far); None where nothing is known or left."""
        if not self.total:
            return None
        work, left = self.done - self.resumed, self.total - self.done
        if work <= 0 or left <= 0:
            return None
        half = bisect.bisect_right(self.work, work / 2) - 1
        then_work, then = self.work[half], self.seconds[half]
        if then_work <= 0 or then <= 0 or elapsed <= then:
            return left * elapsed / work
        power = min(1.0, math.log(elapsed / then) / math.log(work / then_work))
        return elapsed * ((work + left) / work) ** power - elapsed

    def report(self, final: bool = False) -> str:
        """The progress line for what is done now (``final``: without the time left)."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = (self.done - self.resumed) / elapsed
        text = f"{self.stage}: {self.done:,}"
        if self.total:
            text += f"/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.0f} {self.unit}/s"
        left = None if final else self.seconds_left(elapsed)
        if left is not None:
            text += f", about {_duration(left)} left"
        return text

    def update(self, count: int = 1) -> None:
        """Add ``count`` to what is done; log a line if ``interval`` seconds have passed."""
        self.done += count
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.log.info(self.report())
            self.work.append(self.done - self.resumed)
            self.seconds.append(now - self.start)

    def resume(self, count: int) -> None:
        """Count ``count`` as done by an earlier run: done, but not part of this run's rate."""
        self.done += count
        self.resumed += count

    def finish(self, always: bool = False) -> None:
        """Log the final count, rate and time taken: at the info level if the stage logged
        progress, took ``interval`` seconds or more, or ``always`` (a line read by another
        program), else at the debug level."""
        elapsed = time.monotonic() - self.start
        level = logging.INFO if always or len(self.work) > 1 or elapsed >= self.interval else logging.DEBUG
        self.log.log(level, "%s in %s", self.report(final=True), _duration(elapsed))


@contextlib.contextmanager
def watching(path: str, on_text: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, call ``on_text`` every :data:`POLL` seconds (and once at its
    end) with what has been written to ``path`` since the last call: by a child process
    (the aligner), whose log lines, its progress among them, go only there."""
    stop, seen = threading.Event(), [0]

    def look() -> None:
        try:
            with open(path, "rb") as f:
                f.seek(seen[0])
                data = f.read()
        except FileNotFoundError:
            return
        seen[0] += len(data)
        if data:
            on_text(data.decode("utf-8", errors="replace"))

    def loop() -> None:
        while not stop.wait(POLL):
            look()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        look()


def relay_log_lines(log: logging.Logger) -> Callable[[str], None]:
    """An ``on_text`` for :func:`watching` that logs the log lines of a child command
    (``TIME | message``) as this process's own; other output stays where it was written."""
    partial = [""]

    def on_text(text: str) -> None:
        complete, _, partial[0] = (partial[0] + text).rpartition("\n")
        for match in LOG_LINE.finditer(complete):
            log.info(match[1])
    return on_text
