"""Run fairseq's real command-line tools, and Python code, from the test virtual environment."""
import os
import re
import subprocess
import sys

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
