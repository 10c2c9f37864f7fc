"""The thread count of the plugin's commands and recipes (fairseq_convs2s_ext.threads): no more
threads than idle cores, OMP_NUM_THREADS when the user set it, a library's own choice untouched."""
import os
import re
import subprocess
import sys

import pytest

from fairseq_convs2s_ext import threads
from fairseq_convs2s_ext.threads import Threads, choose


def test_omp_num_threads_decides_when_set():
    assert choose({"OMP_NUM_THREADS": "3"}, cores=2, idle=0.0) == Threads(3, "OMP_NUM_THREADS=3")
    assert choose({"OMP_NUM_THREADS": " 1 "}, cores=16, idle=16.0).count == 1


def test_idle_cores_decide_otherwise():
    assert choose({}, cores=2, idle=0.0).count == 1  # a busy machine: one thread, never none
    assert choose({}, cores=2, idle=0.9).count == 1
    assert choose({}, cores=2, idle=1.6).count == 2
    assert choose({}, cores=8, idle=5.4).count == 5
    assert choose({}, cores=4, idle=4.0) == Threads(4, "4.0 of the 4 usable cores were idle; set OMP_NUM_THREADS "
                                                       "to choose")
    assert choose({}, cores=6, idle=None) == Threads(6, "the 6 usable cores; set OMP_NUM_THREADS to choose")


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_an_unusable_omp_num_threads_is_ignored_with_a_warning(value, caplog):
    assert choose({"OMP_NUM_THREADS": value}, cores=2, idle=2.0).count == 2
    assert f"OMP_NUM_THREADS={value!r} is not a positive whole number: ignored" in caplog.text


def test_the_machine_is_measured():
    cores = threads.usable_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    idle = threads.idle_cores(0.1)
    assert idle is not None and 0.0 <= idle <= len(os.sched_getaffinity(0)) + 1e-9
    env = threads.environment(Threads(3, "test"), base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "3"}


def _threads_in(argv0, before="", after=""):
    """What the plugin's import did to torch's threads in a program named ``argv0``, started
    without OMP_NUM_THREADS: (thread counts printed, stderr)."""
    code = (f"import sys, torch\nsys.argv = [{argv0!r}]\n{before}\nimport fairseq_convs2s_ext\n"
            f"print('THREADS', torch.get_num_threads())\n{after}")
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", code], env=environ, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [int(n) for n in re.findall(r"^THREADS (\d+)$", proc.stdout, flags=re.M)], proc.stderr


def test_a_fairseq_command_uses_the_chosen_threads():
    """As fairseq-train imports the plugin: the idle cores, logged with how to choose; a later
    choice in the same process follows OMP_NUM_THREADS."""
    (chosen, respected), log = _threads_in(
        "fairseq-train", before="import logging; logging.basicConfig(level=logging.INFO)",
        after="import os\nos.environ['OMP_NUM_THREADS'] = '1'\nfrom fairseq_convs2s_ext import threads\n"
              "threads.apply_to_command()\nprint('THREADS', torch.get_num_threads())")
    assert 1 <= chosen <= threads.usable_cores()
    assert f"using {chosen} CPU thread" in log and "set OMP_NUM_THREADS to choose" in log
    assert respected == 1 and "using 1 CPU thread (OMP_NUM_THREADS=1)" in log


def test_a_program_importing_the_plugin_keeps_its_own_threads():
    assert _threads_in("my-program", before="torch.set_num_threads(3)")[0] == [3]
