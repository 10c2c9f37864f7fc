"""The progress lines' estimate of the time left, on stages with known timings."""
import math
import re
import time

import pytest

from convs2s_preprocess.runtime.progress import Progress


class Clock:
    """time.monotonic, moved by the test."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    return clock


def _run(clock, progress, seconds_at, work_done, step):
    """Update ``progress`` ``step`` at a time until this run has done ``work_done``, the clock
    at ``seconds_at(work)`` after the start; return the time left its line says then, in seconds."""
    start = clock.now
    for work in range(step, work_done + 1, step):
        clock.now = start + seconds_at(work)
        progress.update(step)
    hours, minutes, seconds = re.search(r"about (\d+):(\d\d):(\d\d) left", progress.report()).groups()
    return 3600 * int(hours) + 60 * int(minutes) + int(seconds)


def test_a_steady_stage_is_estimated_at_its_rate(clock):
    """The fitted power is 1: the time left is the work left at the rate so far."""
    progress = Progress("steady", 10_000, unit="lines", interval=10)
    left = _run(clock, progress, lambda work: work / 50, 3_000, 100)
    assert left == 7_000 / 50


def test_a_stage_that_speeds_up_is_not_estimated_at_its_early_rate(clock):
    """Learning BPE's merges get faster as the pairs get rarer: its time grows about as the
    logarithm of the merges made (as on 36M pairs). At 3% of the merges the rate so far puts
    the end some 40 times too late; the fit on the second half of the work is within 3x."""
    merges, seconds_at = 40_000, lambda merge: 100 * math.log(1 + merge / 10)
    progress = Progress("learn BPE", merges, unit="merges", interval=10)
    left = _run(clock, progress, seconds_at, 1_200, 1)
    truth = seconds_at(merges) - seconds_at(1_200)
    at_the_rate = (merges - 1_200) * seconds_at(1_200) / 1_200
    assert at_the_rate > 40 * truth
    assert truth < left < 3 * truth


def test_work_of_an_earlier_run_is_left_out_of_the_fit(clock):
    """Shards an interrupted run finished count as done, not as work of this run's rate."""
    progress = Progress("tokenize", 10_000, unit="lines", interval=10)
    progress.resume(4_000)
    left = _run(clock, progress, lambda work: work / 50, 3_000, 100)
    assert left == 3_000 / 50


def test_a_stage_that_slows_down_is_estimated_at_its_rate(clock):
    """A quick first step, then a long one (learning BPE's first merges on a tiny corpus with
    a line per update): the fit's power would be 13, its estimate past what a line can show
    (an OverflowError ended convs2s-prepare); it is held at the rate's."""
    progress = Progress("learn BPE", 1_000, unit="merges", interval=0)
    left = _run(clock, progress, lambda merge: 0.001 if merge == 1 else 10.0, 2, 1)
    assert left == 998 * 10.0 / 2


def test_a_quick_stage_ends_quietly_and_an_early_stop_promises_no_time_left(clock, caplog):
    """A stage over within the interval leaves its final line to the debug level (a 3,000-line
    corpus gave 20 lines of "100% ... in 0:00:00"); a stage stopped before its total (learning
    BPE when no pair is frequent enough) ended on "about 0:00:13 left"."""
    caplog.set_level("DEBUG", logger="convs2s_preprocess.runtime.progress")
    quick = Progress("tokenize", 3000, unit="lines", interval=10)
    quick.update(3000)
    clock.now += 1
    quick.finish()
    stopped = Progress("learn BPE", 40_000, unit="merges", interval=10)
    for _ in range(20):
        clock.now += 1
        stopped.update(400)
    stopped.finish()
    aligner = Progress("train fast_align's model", 5, unit="pair passes", interval=10)
    aligner.finish(always=True)  # bench.scaling reads this line
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[0] == ("DEBUG", "tokenize: 3,000/3,000 lines (100%), 3,000 lines/s in 0:00:01")
    assert all(level == "INFO" and "left" in line for level, line in lines[1:-2])  # at 10 and 20 s
    assert lines[-2] == ("INFO", "learn BPE: 8,000/40,000 merges (20%), 400 merges/s in 0:00:20")
    assert lines[-1][0] == "INFO" and lines[-1][1].startswith("train fast_align's model: 0/5")
