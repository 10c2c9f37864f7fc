"""The one-line reports of :mod:`fairseq_convs2s_ext.excepthook` come with commands, never with
an import: a program of one's own that imports the plugin keeps its ``sys.excepthook`` and its
tracebacks, however the import happens; fairseq's commands, however they are started, and the
plugin's report an unreadable checkpoint in one line."""
import shutil
import subprocess
import sys

import pytest

import fairseq_convs2s_ext
from conftest import BIN, ROOT

IMPORTS = {
    "import": "import fairseq_convs2s_ext",
    # as fairseq's hub (from_pretrained(..., user_dir=...)) and its commands import --user-dir
    "fairseq's --user-dir import": "import argparse\nfrom fairseq import utils\n"
                                   f"utils.import_user_module(argparse.Namespace(user_dir={fairseq_convs2s_ext.USER_DIR!r}))",
}


def python(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, text=True, capture_output=True)


@pytest.mark.parametrize("how", sorted(IMPORTS))
def test_importing_the_plugin_leaves_sys_excepthook_alone(how):
    proc = python("-c", f"import sys\nhook = sys.excepthook\n{IMPORTS[how]}\n"
                        "assert 'fairseq_convs2s_ext.models' in sys.modules\n"
                        "print(sys.excepthook is hook)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True"]


def test_a_program_of_ones_own_keeps_its_traceback(tmp_path):
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04" + bytes(100))
    proc = python("-c", "import torch\nimport fairseq_convs2s_ext\ntorch.load('cut.pt')", cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "error: cut.pt" not in proc.stderr


def test_python_m_fairseq_cli_reports_an_unreadable_checkpoint_in_one_line(small_bin, tmp_path):
    path = tmp_path / "checkpoint_best.pt"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    proc = python("-m", "fairseq_cli.generate", small_bin, "--user-dir", fairseq_convs2s_ext.USER_DIR,
                  "--path", path, "--gen-subset", "test", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"generate.py: error: {path}: not a readable checkpoint" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def fairseq_command(tool, *args, cwd):
    """fairseq's TOOL with the plugin: (exit status, stderr)."""
    proc = subprocess.run([str(BIN / tool), *map(str, args), "--user-dir", fairseq_convs2s_ext.USER_DIR],
                          cwd=cwd, text=True, capture_output=True, input="A dog runs .\n")
    return proc.returncode, proc.stderr


def assert_one_line(stderr, line):
    assert line in stderr.splitlines(), stderr[-3000:]
    assert "Traceback" not in stderr and "Overrides:" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("tool, options, line", [
    ("fairseq-generate", ["--gen-subset", "test"],
     "none.pt: no such checkpoint file (--path; an ensemble: --path a.pt:b.pt)"),
    ("fairseq-interactive", ["--tokenizer", "moses"],
     "--tokenizer moses needs the languages of the data: add -s SRC -t TGT (e.g. -s en -t de), which the Moses "
     "tokenizer's rules depend on"),
], ids=["missing --path file", "moses without languages"])
def test_a_usage_error_is_one_line(small_bin, tmp_path, tool, options, line):
    status, stderr = fairseq_command(tool, small_bin, "--path", "none.pt", *options, cwd=tmp_path)
    assert status == 1
    assert_one_line(stderr, f"{tool}: error: {line}")


def test_a_malformed_dictionary_is_named(small_bin, tmp_path):
    data = tmp_path / "bin"
    shutil.copytree(small_bin, data)
    (data / "dict.de.txt").write_text("der 10\nnocount\n", encoding="utf-8")
    status, stderr = fairseq_command("fairseq-generate", data, "--path", "none.pt", "--gen-subset", "test",
                                     cwd=tmp_path)
    assert status == 1
    assert_one_line(stderr, f"fairseq-generate: error: {data}/dict.de.txt: not a fairseq dictionary: Incorrect "
                            f"dictionary format, expected '<token> <cnt> [flags]': \"nocount\"; use the "
                            f"dict.LANG.txt that fairseq-preprocess or convs2s-prepare wrote")


def test_a_missing_dictionary_is_named(small_bin, tmp_path):
    status, stderr = fairseq_command("fairseq-generate", small_bin, "-s", "en", "-t", "fr", "--path", "none.pt",
                                     cwd=tmp_path)
    assert status == 1
    assert_one_line(stderr, f"fairseq-generate: error: {small_bin}/dict.fr.txt: no such dictionary: the data folder "
                            f"must hold the dict.LANG.txt of each side (check -s/-t)")


def test_a_folder_without_binaries_whose_languages_cannot_be_told_is_one_line(small_bin, tmp_path):
    for name in ("dict.en.txt", "dict.de.txt"):
        shutil.copy(small_bin / name, tmp_path / name)
    status, stderr = fairseq_command("fairseq-generate", tmp_path, "--path", "none.pt", cwd=tmp_path)
    assert status == 1
    assert_one_line(stderr, f"fairseq-generate: error: {tmp_path}: no binarized split (SPLIT.SRC-TGT.LANG.idx) "
                            f"from which to tell the languages: pass -s SRC -t TGT, or the folder "
                            f"fairseq-preprocess or convs2s-prepare wrote")


def test_an_unknown_error_keeps_its_traceback(small_bin, tmp_path):
    (tmp_path / "file").write_text("")
    status, stderr = fairseq_command("fairseq-generate", small_bin, "--path", "none.pt", "--results-path", "file/out",
                                     cwd=tmp_path)
    assert status == 1 and "Traceback" in stderr, stderr[-3000:]
