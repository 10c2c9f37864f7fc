"""A quiet start (fairseq_convs2s_ext.quiet): fairseq's commands with the plugin, and the hub,
print no warning a user can do nothing about, no DEBUG line, and fairseq's own log format; the
hub's per-call batching lines are DEBUG records. Real commands in subprocesses, stderr read."""
import logging
import subprocess
import sys

import pytest

from conftest import BIN, ROOT

USER_DIR = ROOT / "fairseq_convs2s_ext"
TRAIN = ["--arch", "convs2s_tiny", "--optimizer", "nag", "--lr", "0.25", "--criterion", "convs2s_cross_entropy",
         "--max-tokens", "1000", "--no-progress-bar", "--num-workers", "0", "--seed", "1"]


def stderr_of(*command, cwd):
    """The command's stderr (fairseq-train's log, which goes to stdout, after it)."""
    proc = subprocess.run([*map(str, command)], cwd=cwd, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr + (proc.stdout if "fairseq-train" in str(command[0]) else "")


def assert_quiet(stderr):
    noise = [line for line in stderr.splitlines() if "Warning" in line or "| WARNING |" in line
             or line.startswith("DEBUG") or line.startswith("INFO:")]
    assert not noise, "\n".join(noise)


@pytest.fixture(scope="module")
def checkpoints(small_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("quiet")
    stderr = stderr_of(BIN / "fairseq-train", small_bin, "--user-dir", USER_DIR, "--task", "convs2s_translation",
                       *TRAIN, "--max-update", "2", "--save-dir", save_dir, "--no-epoch-checkpoints", cwd=save_dir)
    return save_dir, stderr


def test_fairseq_train_starts_quietly(checkpoints):
    _, stderr = checkpoints
    assert_quiet(stderr)
    assert "| INFO | fairseq_cli.train | done training" in stderr


def test_fairseq_generate_logs_in_fairseq_format_without_debug_lines(checkpoints, small_bin):
    save_dir, _ = checkpoints
    stderr = stderr_of(BIN / "fairseq-generate", small_bin, "--user-dir", USER_DIR, "--task", "convs2s_translation",
                       "--path", save_dir / "checkpoint_best.pt", "--gen-subset", "test",
                       "--max-len-b", "5", cwd=save_dir)  # an untrained model would write 200 words
    assert_quiet(stderr)
    assert "| INFO | fairseq_cli.generate | Translated 10 sentences" in stderr


HUB = """
import logging, sys
logging.basicConfig(level=logging.INFO)
from fairseq_convs2s_ext import ConvS2SModel
hub = ConvS2SModel.from_pretrained(sys.argv[1], data_name_or_path=sys.argv[2])
print("translating", file=sys.stderr, flush=True)
hub.translate("A dog runs .")
logging.getLogger().setLevel(logging.DEBUG)
hub.translate("A dog runs .")
"""


def test_the_hub_translates_without_warnings_its_batching_lines_at_debug(checkpoints, small_bin):
    save_dir, _ = checkpoints
    stderr = stderr_of(sys.executable, "-c", HUB, save_dir, small_bin, cwd=save_dir)
    quiet, debug = stderr.split("translating\n")[1].split("DEBUG:", 1)
    assert quiet == "" and "Warning" not in debug, stderr[-3000:]
    assert "DEBUG:fairseq.tasks.fairseq_task:creating new batches" in "DEBUG:" + debug


PLAIN = """
import logging, sys
from fairseq_convs2s_ext import ConvS2SModel
hub = ConvS2SModel.from_pretrained(sys.argv[1], data_name_or_path=sys.argv[2])
hub.translate("A dog runs .")
print(logging.getLogger().level, len(logging.getLogger().handlers))
"""


def test_a_program_that_configures_no_logging_gets_pythons_defaults(checkpoints, small_bin):
    """fairseq's import calls logging.basicConfig(level=DEBUG) (wav2vec2_classification); the
    plugin, imported first, leaves the root logger as it was: WARNING, no handler."""
    save_dir, _ = checkpoints
    proc = subprocess.run([sys.executable, "-c", PLAIN, str(save_dir), str(small_bin)], cwd=save_dir, text=True,
                          capture_output=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert proc.stdout.split() == [str(logging.WARNING), "0"]
