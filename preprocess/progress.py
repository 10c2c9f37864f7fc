"""Progress of a long stage as log lines: done, rate, and an estimate of the time left.

A stage of ``convs2s-prepare`` or ``convs2s-align-dict`` on WMT-sized data runs for minutes
to hours; silence for that long looks like a hang. :class:`Progress` logs one line at most
every ``interval`` seconds (and one when the stage ends)::

    learn BPE: 12,000/40,000 merges (30%), 610 merges/s, about 0:00:46 left

Plain log lines, never carriage-return bars, so that a log written to a file stays one
readable line per report (a progress bar's redraws would be one line of thousands).
"""
import datetime
import logging
import time
from typing import Optional

logger = logging.getLogger(__name__)

# Seconds between two progress lines of one stage.
INTERVAL = 10.0


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class Progress:
    """Counts what a stage has done and logs it at intervals.

    ``total`` may be unknown (None): the lines then give the count and the rate only.
    """

    def __init__(self, stage: str, total: Optional[int] = None, unit: str = "pairs",
                 interval: float = INTERVAL, log: logging.Logger = logger):
        self.stage, self.total, self.unit = stage, total, unit
        self.interval, self.log = interval, log
        self.done = 0
        self.start = self.last = time.monotonic()

    def report(self) -> str:
        """The progress line for what is done now."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.stage}: {self.done:,}"
        if self.total:
            text += f"/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.0f} {self.unit}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", about {_duration((self.total - self.done) / rate)} left"
        return text

    def update(self, count: int = 1) -> None:
        """Add ``count`` to what is done; log a line if ``interval`` seconds have passed."""
        self.done += count
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.log.info(self.report())

    def finish(self) -> None:
        """Log the final count, rate and time taken."""
        self.log.info("%s in %s", self.report(), _duration(time.monotonic() - self.start))


class CountingWriter:
    """A text file wrapper that counts the lines written through it as progress.

    For library code that writes one line per unit of work (subword-nmt writes one merge
    per line) but reports its progress only as a terminal bar.
    """

    def __init__(self, file, progress: Progress, header_lines: int = 0):
        self.file, self.progress, self.header = file, progress, header_lines

    def write(self, text: str) -> int:
        lines = text.count("\n")
        skipped = min(lines, self.header)
        self.header -= skipped
        self.progress.update(lines - skipped)
        return self.file.write(text)
