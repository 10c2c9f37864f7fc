"""preprocess/runtime/pool.py on real worker processes: results in order, state handed to the workers
by their fork, a normal end that terminates no one, and failures that stop every worker and
say so in one line. tests/test_runtime_hang.py runs the stages under load and signals."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.runtime import pool
from convs2s_preprocess.runtime.host import descendants
from convs2s_preprocess.runtime.pool import beside, map_batches, worker_pool
from faults import ctrl_c_as_a_terminal_sends_it, wait_until


def _square(x):
    return x * x


def _locked_add(lock, x):
    with lock:
        return x + 1


def _fail_on(bad, x):
    if x == bad:
        raise PreprocessError(f"item {x} is bad")
    return x


def _die(x):
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def _stubborn(x):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_results_come_in_order(workers):
    assert list(map_batches(_square, range(50), workers)) == [x * x for x in range(50)]


@pytest.mark.parametrize("workers", [1, 3])
def test_the_shared_state_reaches_the_workers_without_pickling(workers):
    """A lock cannot be pickled: the workers get it with their fork (the executor's initargs)."""
    assert list(map_batches(_locked_add, range(20), workers, threading.Lock())) == list(range(1, 21))


def test_a_normal_end_terminates_no_one():
    """Every worker exits by itself (status 0), also one that had no work yet: the pool that
    hung convs2s-prepare ended with Pool.terminate. Pool.stop reads the executor's private
    ``_processes``, as this test does: it fails if they go."""
    with worker_pool(4) as pool:
        assert pool.submit(_square, 3).result() == 9
        processes = list(pool.executor._processes.values())
    assert len(processes) == 4 and [p.exitcode for p in processes] == [0] * 4


def _left() -> list:
    """This process's descendants: state and command line of each."""
    left = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                left.append((pid, stat.read().rsplit(")", 1)[1].split()[0], cmdline.read()[:200]))
        except OSError:  # gone meanwhile
            pass
    return left


def test_a_failure_stops_every_worker_and_is_raised_as_it_was():
    with pytest.raises(PreprocessError, match="item 5 is bad"):
        list(map_batches(_fail_on, range(100), 2, 5))
    assert wait_until(lambda: not _left(), 5), _left()


def test_a_killed_worker_is_one_line_not_a_hang():
    with pytest.raises(PreprocessError, match="a worker process was killed before it finished"):
        list(map_batches(_die, range(20), 2))


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(monkeypatch):
    monkeypatch.setattr(pool, "STOP_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(KeyError):
        with worker_pool(2) as workers:
            workers.submit(_stubborn, 1)
            time.sleep(0.5)
            raise KeyError("the caller failed")
    assert time.monotonic() - started < 10
    assert wait_until(lambda: not _left(), 5), _left()


def _fails():
    raise PreprocessError("nothing to align")


def test_beside_names_the_work_in_its_error():
    with pytest.raises(PreprocessError, match="^alignment dictionary: nothing to align$"):
        with beside("alignment dictionary", _fails):
            pass


LATE_SIGNAL = """
import sys, time
from convs2s_preprocess.runtime.processes import exit_on_sigterm
exit_on_sigterm()


class SlowToFree:  # freed as Python shuts down, after it has put back the signals' default actions
    def __del__(self):
        time.sleep(2)


kept = SlowToFree()
print("done", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_python_shuts_down_a_finished_command_does_not_kill_it(sig):
    """Found by test_runtime_hang's slow runs: 3 of 300 ended with exit status -15 when the
    SIGTERM came as the command was ending: its work was done, but Python had put back
    SIGTERM's default action."""
    proc = subprocess.Popen([sys.executable, "-c", LATE_SIGNAL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ctrl_c_as_a_terminal_sends_it)
    try:
        assert proc.stdout.readline() == "done\n"
        time.sleep(1)  # in SlowToFree.__del__
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and stderr == ""
