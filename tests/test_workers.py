"""The worker pool that convs2s-serve --workers, convs2s-translate --workers and HubWorkers
start (convs2s_serving.workers.started_pool): a worker that dies while the pool starts fails
the start, at once, and leaves no process behind.

Each case runs in a process of its own, bounded, as a hang is what it guards against; the
workers' initializers are this module's functions (a spawned worker imports them by name)."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BOUND = 120  # seconds: a start that fails takes about one worker's start (importing torch)


def load(counter, die_as, delay):
    """A worker's load: the ``die_as``-th worker to arrive here dies at once (0: none does);
    the others take ``delay`` seconds."""
    with counter.get_lock():
        counter.value += 1
        arrived = counter.value
    if arrived == die_as:
        os._exit(1)
    time.sleep(delay)


def _start(workers, die_as, delay=0.0):
    script = textwrap.dedent(f"""
        import multiprocessing, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from convs2s_serving.workers import started_pool
        from test_workers import load
        counter = multiprocessing.get_context("spawn").Value("i", 0)
        began = time.monotonic()
        try:
            pool = started_pool({workers}, load, (counter, {die_as}, {delay}))
        except Exception as e:
            print("failed", type(e).__name__, round(time.monotonic() - began, 1), flush=True)
        else:
            print("started", flush=True)
            pool.shutdown()
        print("left", len(multiprocessing.active_children()), flush=True)
    """)
    started = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = started.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        out, err = "hung", ""
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started.pid, signal.SIGKILL)  # and every worker it started
        started.wait()
    return out.split("\n"), err


@pytest.mark.parametrize("die_as", [1, 2])
def test_a_worker_that_dies_while_the_pool_starts_fails_the_start(die_as):
    """The first or the last worker to load dies: the pool's start raises BrokenProcessPool
    and ends the other worker, whether or not the pool was watching the dead one yet."""
    out, err = _start(2, die_as)
    assert out[0].startswith("failed BrokenProcessPool"), (out, err)
    assert out[1] == "left 0" and not err, (out, err)


def test_a_pool_whose_workers_load_starts():
    out, err = _start(2, 0, delay=1.0)
    assert out[:2] == ["started", "left 0"], (out, err)
