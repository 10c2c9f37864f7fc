"""fairseq's commands with the plugin show, under --help, the options of the --task, --arch and
components given (fairseq answers --help before it adds them: fairseq_convs2s_ext.cli.fairseq_help)."""
import subprocess

import pytest

from conftest import BIN, ROOT

USER_DIR = ROOT / "fairseq_convs2s_ext"


def help_of(tool, *args):
    proc = subprocess.run([str(BIN / tool), "--user-dir", str(USER_DIR), *args], cwd=ROOT, text=True,
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("tool, args, shown", [
    ("fairseq-train", ["--help", "--task", "convs2s_translation", "--arch", "convs2s_wmt_en_ro"],
     ["--vocab-selection", "--autocast-bf16", "--beam-step", "--encoder-layers", "--decoder-attention",
      "--left-pad-source", "Model-specific configuration:"]),
    ("fairseq-train", ["-h", "--arch", "fconv", "--criterion", "convs2s_cross_entropy", "--optimizer", "nag"],
     ["--encoder-layers", "--label-smoothing", "--momentum"]),
    ("fairseq-generate", ["--task", "convs2s_translation", "--help"], ["--beam-step", "--replace-unk", "--vocab-rest-clusters"]),
], ids=["train convs2s", "train fconv and components", "generate"])
def test_help_shows_the_options_of_the_task_architecture_and_components(tool, args, shown):
    text = help_of(tool, *args)
    assert f"usage: {tool} " in text
    missing = [option for option in shown if option not in text]
    assert not missing
