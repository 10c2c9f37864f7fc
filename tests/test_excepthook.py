"""The one-line reports of :mod:`fairseq_convs2s_ext.excepthook` come with commands, never with
an import: a program of one's own that imports the plugin keeps its ``sys.excepthook`` and its
tracebacks, however the import happens; fairseq's commands, however they are started, and the
plugin's report an unreadable checkpoint in one line."""
import subprocess
import sys

import pytest

import fairseq_convs2s_ext
from conftest import ROOT

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
