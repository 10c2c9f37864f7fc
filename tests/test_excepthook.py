"""The one-line reports of :mod:`fairseq_convs2s_ext.excepthook` come with commands, never with
an import: a program of one's own that imports the plugin keeps its ``sys.excepthook`` and its
tracebacks, however the import happens; fairseq's commands, however they are started, and the
plugin's report an unreadable checkpoint in one line; so are the errors a user can fix (a
missing --path file or dictionary, a malformed dictionary, --tokenizer moses without -s/-t),
while an unknown error keeps its traceback."""
import os
import shutil
import subprocess
import sys

import pytest
from fairseq.tasks.translation import TranslationConfig, TranslationTask

import fairseq_convs2s_ext
from conftest import BIN, COMMAND_TIMEOUT, ROOT
from fairseq_convs2s_ext.excepthook import describe

IMPORTS = {
    "import": "import fairseq_convs2s_ext",
    # as fairseq's hub (from_pretrained(..., user_dir=...)) and its commands import --user-dir
    "fairseq's --user-dir import": "import argparse\nfrom fairseq import utils\n"
                                   f"utils.import_user_module(argparse.Namespace(user_dir={fairseq_convs2s_ext.USER_DIR!r}))",
}


def python(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, text=True, capture_output=True,
                          timeout=COMMAND_TIMEOUT)


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
    assert f"generate.py: error: {path}: cut short or damaged" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def fairseq_command(tool, *args, cwd):
    """fairseq's TOOL with the plugin: (exit status, stderr)."""
    proc = subprocess.run([str(BIN / tool), *map(str, args), "--user-dir", fairseq_convs2s_ext.USER_DIR],
                          cwd=cwd, text=True, capture_output=True, input="A dog runs .\n", timeout=COMMAND_TIMEOUT)
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


def raised_by(call, *args):
    """What the excepthook would print for the exception that ``call(*args)`` (fairseq's code)
    raises: describe() of it and its traceback, in this process (the hook's printing is
    tested through commands above)."""
    try:
        call(*args)
    except Exception as e:  # noqa: BLE001  (whatever fairseq raises is the subject)
        return describe(e, e.__traceback__)
    raise AssertionError(f"{call.__name__} raised nothing")


def test_a_missing_dictionary_is_named(small_bin):
    message = raised_by(TranslationTask.setup_task, TranslationConfig(data=str(small_bin), source_lang="en",
                                                                      target_lang="fr"))
    assert message == (f"{small_bin}/dict.fr.txt: no such dictionary: the data folder must hold the "
                       f"dict.LANG.txt of each side (check -s/-t)")


def test_a_folder_without_binaries_whose_languages_cannot_be_told_is_named(small_bin, tmp_path):
    for name in ("dict.en.txt", "dict.de.txt"):
        shutil.copy(small_bin / name, tmp_path / name)
    assert raised_by(TranslationTask.setup_task, TranslationConfig(data=str(tmp_path))) == (
        f"{tmp_path}: no binarized split (SPLIT.SRC-TGT.LANG.idx) from which to tell the languages: pass -s SRC "
        f"-t TGT, or the folder fairseq-preprocess or convs2s-prepare wrote")


def test_an_unknown_error_keeps_its_traceback(tmp_path):
    (tmp_path / "file").write_text("")
    assert raised_by(os.makedirs, tmp_path / "file" / "out") is None  # the hook hands it on unchanged
