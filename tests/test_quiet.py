"""A quiet start (fairseq_convs2s_ext.quiet): fairseq's commands with the plugin, and the hub,
print no warning a user can do nothing about, no DEBUG line, and fairseq's own log format; the
hub's per-call batching lines are DEBUG records. The commands log their configuration in a few
lines (fairseq-train saves all of it beside the checkpoints) and no per-batch lines, unless
CONVS2S_FULL_LOG=1. Real commands in subprocesses, stderr read."""
import logging
import os
import subprocess
import sys

import pytest
import yaml

from conftest import BIN, COMMAND_TIMEOUT, ROOT

USER_DIR = ROOT / "fairseq_convs2s_ext"
TRAIN = ["--arch", "convs2s_tiny", "--optimizer", "nag", "--lr", "0.25", "--criterion", "convs2s_cross_entropy",
         "--max-tokens", "1000", "--no-progress-bar", "--num-workers", "0", "--seed", "1"]


def stderr_of(*command, cwd, input=None, env=None):
    """The command's stderr (fairseq-train's log, which goes to stdout, after it)."""
    proc = subprocess.run([*map(str, command)], cwd=cwd, text=True, capture_output=True, input=input,
                          env=None if env is None else {**os.environ, **env}, timeout=COMMAND_TIMEOUT)
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
                          capture_output=True, timeout=COMMAND_TIMEOUT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert proc.stdout.split() == [str(logging.WARNING), "0"]


PER_BATCH = ("can_reuse_epoch_itr", "reuse_dataloader", "rebuild_batches", "creating new batches")
LONG_LINE = 500  # characters; fairseq's configuration line has about 7,000 with the tiny model


def configuration_block(log, command):
    """The configuration record's first line and the lines under it."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if f"| INFO | fairseq_cli.{command} | configuration, where it differs from the defaults" in line)
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    return lines[start], lines[start + 1:end]


def test_fairseq_train_logs_its_configuration_in_a_few_lines_and_saves_all_of_it(checkpoints, small_bin):
    save_dir, log = checkpoints
    head, groups = configuration_block(log, "train")
    assert head.endswith(f"(all of it in {save_dir / 'config.yaml'}):")
    assert len(groups) <= 12 and "  dataset: num_workers=0 max_tokens=1000" in groups, groups
    assert f"  task: convs2s_translation data={small_bin}" in groups and "  model: convs2s_tiny" in groups
    assert max(map(len, log.splitlines())) < LONG_LINE and not [line for line in log.splitlines()
                                                                 if any(word in line for word in PER_BATCH)]
    saved = yaml.safe_load((save_dir / "config.yaml").read_text(encoding="utf-8"))
    assert saved["dataset"]["max_tokens"] == 1000 and saved["optimization"]["max_update"] == 2
    assert saved["common"]["log_interval"] == 100 and saved["model"]["_name"] == "convs2s_tiny"
    assert saved["task"]["_name"] == "convs2s_translation" and saved["task"]["data"] == str(small_bin)
    assert not [name for name in os.listdir(save_dir) if name.endswith(".tmp")]


def interactive_log(save_dir, small_bin, env=None):
    """fairseq-interactive's log of six sentences, read two at a time."""
    return stderr_of(BIN / "fairseq-interactive", small_bin, "--user-dir", USER_DIR, "--task", "convs2s_translation",
                     "--path", save_dir / "checkpoint_best.pt", "--buffer-size", 2, "--max-len-b", 5,
                     cwd=save_dir, input="A dog runs .\n" * 6, env=env)


def test_fairseq_interactive_logs_no_line_per_batch_and_its_configuration_readably(checkpoints, small_bin):
    save_dir, _ = checkpoints
    log = interactive_log(save_dir, small_bin)
    head, groups = configuration_block(log, "interactive")
    assert head.endswith("(CONVS2S_FULL_LOG=1 logs all of it):") and "  interactive: buffer_size=2" in groups
    assert max(map(len, log.splitlines())) < LONG_LINE
    assert not [line for line in log.splitlines() if any(word in line for word in PER_BATCH)], log


def test_convs2s_full_log_restores_fairseqs_own_lines(checkpoints, small_bin):
    save_dir, _ = checkpoints
    log = interactive_log(save_dir, small_bin, env={"CONVS2S_FULL_LOG": "1"})
    assert sum("| fairseq.tasks.fairseq_task | can_reuse_epoch_itr = " in line for line in log.splitlines()) == 3
    whole = [line for line in log.splitlines()
             if "| INFO | fairseq_cli.interactive | {'_name': None, 'common':" in line]
    assert len(whole) == 1 and len(whole[0]) > 5000 and "configuration, where it differs" not in log
