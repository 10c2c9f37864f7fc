"""A convs2s checkpoint used for another language pair than it was trained on is refused,
naming both (even with a joined dictionary, whose fingerprint matches either way); used under
fairseq's stock translation task, it says in one line what that loses."""
import subprocess

import pytest

from conftest import BIN, ROOT

USER_DIR = ROOT / "fairseq_convs2s_ext"


def fairseq(tool, *args, cwd):
    proc = subprocess.run([str(BIN / tool), *map(str, args), "--user-dir", str(USER_DIR)], cwd=cwd, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc.returncode, proc.stdout


@pytest.fixture(scope="module")
def en_de(small_bin, tmp_path_factory):
    """A tiny model trained en->de on a joined dictionary, the pair inferred from the file names."""
    save_dir = tmp_path_factory.mktemp("languages")
    status, out = fairseq("fairseq-train", small_bin, "--task", "convs2s_translation", "--arch", "convs2s_tiny",
                          "--optimizer", "nag", "--lr", "0.25", "--criterion", "convs2s_cross_entropy",
                          "--max-tokens", "1000", "--max-update", "2", "--num-workers", "0", "--no-progress-bar",
                          "--save-dir", save_dir, "--no-epoch-checkpoints", cwd=save_dir)
    assert status == 0, out[-3000:]
    return save_dir / "checkpoint_best.pt"


def test_the_reverse_pair_is_refused_naming_both(en_de, small_bin, tmp_path):
    status, out = fairseq("fairseq-generate", small_bin, "-s", "de", "-t", "en", "--task", "convs2s_translation",
                          "--path", en_de, "--gen-subset", "test", cwd=tmp_path)
    assert status == 1
    assert (f"fairseq-generate: error: {en_de}: the checkpoint was trained to translate en->de, and this run asks "
            f"for de->en (-s de -t en): pass -s en -t de, or a checkpoint trained de->en") in out.splitlines()
    assert "Traceback" not in out


def test_the_stock_task_says_what_it_loses_in_one_line(en_de, small_bin, tmp_path):
    """(Under the plugin's task no warning is logged: test_quiet.)"""
    status, out = fairseq("fairseq-generate", small_bin, "-s", "en", "-t", "de", "--task", "translation",
                          "--path", en_de, "--gen-subset", "test", cwd=tmp_path)
    assert status == 0, out[-3000:]
    warnings = [line for line in out.splitlines() if "| WARNING |" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        "the convs2s model under --task translation loses the plugin's task: an over-long input line skipped "
        "and reported (not a crash), an empty line translated as empty, --replace-unk, the lean beam step "
        "(faster on a CPU), --autocast-bf16 and --vocab-selection; add --task convs2s_translation")
