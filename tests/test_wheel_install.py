"""The plugin installed as a user installs a library, and used from a folder of the user's own.

A wheel is built from a copy of the checkout's packages (nothing is written into the checkout)
and installed into a fresh virtual environment outside it; every command then runs with the
current folder outside the checkout, so that anything that still depends on the checkout
(a config folder, a relative --user-dir, a work folder placed beside the package) fails here.
The new environment borrows the checkout environment's dependencies (torch, fairseq, ...)
through a ``.pth`` line naming its site-packages, which adds that folder to ``sys.path``
without running its own ``.pth`` files: the editable install's finder stays off, and the
plugin comes from the wheel alone (asserted below). fairseq's console scripts are written for
the new environment as pip writes them. The lean beam step's kernel is built from a copy of
the installed source in the user's torch extensions folder: the same text as the checkout's,
so the kernel the checkout built serves both (serving/top_log_probs.py).
"""
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from tiny_runs import raw_multi30k

PACKAGES = ("fairseq_convs2s_ext", "preprocess", "recipes", "serving")


@dataclass
class Installed:
    venv: Path
    site: Path  # the new environment's site-packages, where the wheel's packages are
    home: Path  # the user's folder: every command runs here
    env: dict

    def sh(self, command, *, env=None, check=True, input=None):
        """``command`` through bash in the user's folder, the new environment's scripts first on
        PATH; returns its output (stdout and stderr together)."""
        proc = subprocess.run(["bash", "-c", command], cwd=self.home, env={**self.env, **(env or {})}, text=True,
                              input=input, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if check and proc.returncode != 0:
            raise AssertionError(f"{command} failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
        return proc.stdout


def _build_wheel(base):
    source = base / "source"
    source.mkdir()
    for name in ("setup.py", "MANIFEST.in", "README.md", "LICENSE", "CITATION.cff"):  # what an sdist carries
        shutil.copy(ROOT / name, source)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(base / "dist"), str(source)], check=True, cwd=base)
    (wheel,) = (base / "dist").glob("fairseq_convs2s_ext-*.whl")
    return wheel


def _console_scripts(venv, distribution):
    """``distribution``'s console scripts in ``venv/bin``, written as pip writes them."""
    for entry in importlib.metadata.distribution(distribution).entry_points.select(group="console_scripts"):
        script = venv / "bin" / entry.name
        script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {entry.module} import {entry.attr}\n"
                          f"if __name__ == '__main__':\n    sys.exit({entry.attr}())\n")
        script.chmod(0o755)


@pytest.fixture(scope="module")
def installed(tmp_path_factory, data_dir):
    base = tmp_path_factory.mktemp("wheel-install")
    wheel = _build_wheel(base)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "checkout_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    _console_scripts(venv, "fairseq-fixed")
    home = base / "home"
    home.mkdir()
    checkout_bin = str(Path(sys.executable).parent)
    path = [str(venv / "bin")] + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != checkout_bin]
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=os.pathsep.join(path), VIRTUAL_ENV=str(venv), CONVS2S_DATA=str(data_dir))
    return Installed(venv, site, home, env)


@pytest.fixture(scope="module")
def trained(installed, data_dir):
    """A few hundred Multi30k lines prepared by the installed convs2s-prepare (relative paths)
    and a tiny model trained on them by fairseq-train with ``--user-dir $(convs2s-user-dir)``:
    (convs2s-prepare's output, checkpoint)."""
    raw_multi30k(data_dir, installed.home)
    log = installed.sh("convs2s-prepare -s en -t de --trainpref raw/train --validpref raw/valid --testpref raw/test "
                       "-o prepared --workers 1 --bpe-merges 500")
    installed.sh('fairseq-train prepared/bin --user-dir "$(convs2s-user-dir)" --task convs2s_translation '
                 "--arch convs2s_tiny --criterion convs2s_cross_entropy --optimizer nag --lr 0.25 --clip-norm 0.1 "
                 "--max-tokens 1000 --max-update 5 --save-dir checkpoints --no-epoch-checkpoints --num-workers 0 "
                 "--seed 1 --no-progress-bar")
    return log, installed.home / "checkpoints" / "checkpoint_best.pt"


def test_the_packages_and_their_data_come_from_the_wheel(installed):
    code = ("import fairseq_convs2s_ext, convs2s_recipes, convs2s_preprocess, convs2s_serving\n"
            "for m in (fairseq_convs2s_ext, convs2s_recipes, convs2s_preprocess, convs2s_serving): print(m.__file__)\n"
            "print(fairseq_convs2s_ext.USER_DIR)")
    *files, user_dir = installed.sh(f"python -c {shlex.quote(code)}").split()[-5:]
    assert all(Path(f).is_relative_to(installed.site) for f in files), files
    assert user_dir == str(installed.site / "fairseq_convs2s_ext")  # what convs2s-user-dir prints
    config_dir = Path(installed.sh("convs2s-recipe --config-dir").strip())
    assert config_dir == installed.site / "convs2s_recipes" / "configs"
    assert {p.name for p in (config_dir / "recipe").glob("*.yaml")} >= {"wmt16_en_ro.yaml", "multi30k_demo.yaml"}
    kernels = {p.name for p in (ROOT / "serving").glob("*.cpp")}  # every kernel's source ships
    assert {p.name for p in (installed.site / "convs2s_serving").glob("*.cpp")} == kernels
    assert {"top_log_probs.cpp", "int8_linear.cpp", "search_step.cpp"} <= kernels


def hypothesis_ids(text):
    """The sentence numbers of fairseq-generate's output ``text``."""
    return sorted(int(m) for m in re.findall(r"^H-(\d+)\t", text, flags=re.M))


@pytest.mark.slow  # 46 s; the recipe runner also runs in test_recipes.py::test_shortened_demo
def test_smoke_recipe_runs_in_the_current_folder(installed):
    """The whole en-ro recipe on local data (prepare, fairseq-hydra-train's training on the
    installed configs, generate, score), its work folder in ./work of the folder it runs in,
    its fairseq-generate told the recipe's threads."""
    count = "1"  # the pass-through is tested; the idle-core choice of a busy machine would make it 1 anyway
    log = installed.sh("convs2s-recipe wmt16-en-ro --smoke", env={"OMP_NUM_THREADS": count})
    work = installed.home / "work" / "wmt16-en-ro-smoke"
    assert not (installed.site / "work").exists()
    assert hypothesis_ids((work / "generate-test.txt").read_text(encoding="utf-8")) == list(range(1999))  # all of newstest2016
    results = json.loads((work / "report.json").read_text())
    assert results["sacrebleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    report = (work / "report.md").read_text()
    assert "test sentences: 1999" in report and f"CPU threads: {count} (OMP_NUM_THREADS={count})" in report
    assert "num_updates 60" in log
    assert f"generating: OMP_NUM_THREADS={count} fairseq-generate" in log
    # The Romanian side was normalized as in Sennrich's WMT16 pipeline (no diacritics).
    train_ro = (work / "prepared" / "tok" / "train.clean.ro").read_text(encoding="utf-8")
    assert not set("ăâîșțşţ") & set(train_ro)


def test_fairseq_hydra_train_finds_the_installed_configs(installed, trained):
    installed.sh('fairseq-hydra-train --config-dir "$(convs2s-recipe --config-dir)" --config-name recipe/multi30k_demo '
                 "task.data=prepared/bin checkpoint.save_dir=hydra-checkpoints model=convs2s_tiny "
                 "optimization.max_update=2 dataset.max_tokens=500")
    state = torch.load(installed.home / "hydra-checkpoints" / "checkpoint_last.pt", map_location="cpu")
    assert state["cfg"]["common"]["user_dir"] == str(installed.site / "fairseq_convs2s_ext")
    assert state["cfg"]["model"]["_name"] == "convs2s_tiny" and state["optimizer_history"][-1]["num_updates"] == 2


def test_generate_and_the_command_prepare_prints(installed, trained):
    """fairseq-generate with the installed plugin (its lean step's kernel loaded), and fairseq-interactive exactly as convs2s-prepare's last line says."""
    prepare_log, checkpoint = trained
    log = installed.sh(f'fairseq-generate prepared/bin --user-dir "$(convs2s-user-dir)" --task convs2s_translation '
                       f"--path {checkpoint} --beam 5 --batch-size 32")
    assert hypothesis_ids(log) == list(range(20))
    assert "kernel is not used" not in log
    hint = re.search(r"to translate untokenized text with a model trained on it: (fairseq-interactive .*)$",
                     prepare_log, flags=re.M).group(1)
    assert '--user-dir "$(convs2s-user-dir)"' in hint and "--task convs2s_translation" in hint
    out = installed.sh(hint.replace("CHECKPOINT", str(checkpoint)) + " --beam 2", input="A dog runs in the park.\n")
    assert re.search(r"^D-0\t", out, flags=re.M), out[-3000:]


def test_hub_translates_with_the_installed_plugin(installed, trained):
    code = ("from fairseq_convs2s_ext import ConvS2SModel\n"
            "hub = ConvS2SModel.from_pretrained('checkpoints', data_name_or_path='prepared')\n"
            "print('TRANSLATION', repr(hub.translate('A dog runs in the park.', beam=2)))")
    out = installed.sh(f"python -c {shlex.quote(code)}")
    assert re.search(r"^TRANSLATION '.+'$", out, flags=re.M), out[-3000:]


def test_an_exported_model_serves_from_the_wheel(installed, trained):
    """convs2s-export and convs2s-serve as installed: the folder written, raw text translated."""
    _, checkpoint = trained
    installed.sh(f"convs2s-export --path {checkpoint} --data prepared -o exported")
    out = installed.sh("convs2s-serve exported 2> served.log", input="A dog runs through the snow.\n\n")
    assert len(out.splitlines()) == 2 and out.splitlines()[0] and not out.splitlines()[1]
    assert "convs2s-serve: 2 sentences in" in (installed.home / "served.log").read_text()
