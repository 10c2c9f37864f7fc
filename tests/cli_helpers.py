"""Run fairseq's real command-line tools, and Python code, from the test virtual environment."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import BIN, COMMAND_TIMEOUT, ROOT
from convs2s_recipes.settings import fairseq_options, training_config

# The paper's optimizer, schedule, clipping and loss settings (recipes/configs/paper.yaml), as
# fairseq-train's options; pass --criterion with them.
PAPER_OPTIONS = fairseq_options(training_config())


def run(tool, *args, cwd=ROOT, check=True, input=None):
    """Run `tool` (a fairseq-* or convs2s-* command); return its combined output."""
    proc = subprocess.run(
        [str(BIN / tool), *map(str, args)], cwd=cwd, input=input, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=COMMAND_TIMEOUT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
    return proc.stdout if check else proc


def in_python(code, **env):
    """Run ``code`` in a fresh interpreter of the test environment, ``env`` added to this
    one's; return its combined output, asserting that it succeeded."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, timeout=300,
                          env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


def valid_losses(log):
    """The validation loss after each epoch, as fairseq-train prints it."""
    return [float(x) for x in re.findall(r"\| valid on 'valid' subset \| loss ([\d.]+)", log)]


def hypotheses(log):
    """{sentence id: hypothesis} from fairseq-generate output."""
    return {int(m[0]): m[1] for m in re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.M)}


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def run_killing_a_worker(tool, *args):
    """Run ``tool`` (a command started with ``--workers``) and SIGKILL its first multiprocessing
    worker as soon as it appears, as the kernel's out-of-memory killer would; return its exit
    status and stderr."""
    command = subprocess.Popen([str(BIN / tool), *map(str, args)], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while not (workers := _spawned_workers(command.pid)) and command.poll() is None:
            assert time.monotonic() < deadline, "no worker started"
            time.sleep(0.2)
        os.kill(workers[0], signal.SIGKILL)
        _, stderr = command.communicate(timeout=COMMAND_TIMEOUT)
    finally:
        command.kill()
    return command.returncode, stderr


def _spawned_workers(pid):
    """The process ids of ``pid``'s multiprocessing workers (not its resource tracker)."""
    found = []
    for child in Path("/proc").glob("[0-9]*"):
        try:
            stat = (child / "stat").read_text()
            cmdline = (child / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"spawn_main" in cmdline:
            found.append(int(child.name))
    return found
