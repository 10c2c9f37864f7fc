"""Recipes end to end (a shortened `make demo`; the en-ro smoke run is in test_wheel_install.py)
and their building blocks: work and data folders, configs, generation, corpora."""
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest
from omegaconf import OmegaConf

from conftest import BIN, ROOT
from convs2s_recipes import corpora, run, score
from convs2s_recipes.download import DownloadError
from convs2s_recipes.settings import CONFIG_DIR, OPTIMIZATION, fairseq_options, training_config
from fairseq_convs2s_ext import USER_DIR
from fairseq_convs2s_ext.threads import Threads


def make(target, work, *args, data_dir):
    proc = subprocess.run(["make", "-C", str(ROOT), target, f"WORK={work}", f"DATA={data_dir}", *args],
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return proc.stdout


def hypothesis_ids(path):
    return sorted(int(m) for m in re.findall(r"^H-(\d+)\t", path.read_text(encoding="utf-8"), flags=re.M))


# The en-ro smoke recipe runs from a wheel's install, in a folder outside the checkout:
# tests/test_wheel_install.py.


def test_shortened_demo(tmp_path, data_dir):
    work = tmp_path / "demo"
    log = make("demo", work, "ARGS=optimization.stop_time_hours=0.005", data_dir=data_dir)
    assert hypothesis_ids(work / "generate-test.txt") == list(range(1000))  # all of test_2016_flickr
    assert re.search(r"sacrebleu: BLEU = [\d.]+ ", log)
    assert "signature: nrefs:1" in log and "## Examples" in log


@pytest.mark.slow
def test_smoke_recipe_multi30k_unk(tmp_path, data_dir):
    """The unknown-word recipe with a tiny model: word-level Multi30k (4000 words a side), the
    alignment dictionary, every test sentence translated without and with --replace-unk, both
    scored, and each <unk> accounted for as a dictionary translation or a copy."""
    work = tmp_path / "unk"
    make("recipe-multi30k-unk", work, "SMOKE=1", data_dir=data_dir)
    plain, replaced = work / "generate-test.txt", work / "generate-test-replace-unk.txt"
    assert hypothesis_ids(plain) == hypothesis_ids(replaced) == list(range(1000))
    assert "<unk>" in plain.read_text(encoding="utf-8")
    assert not re.search(r"^H-.*<unk>", replaced.read_text(encoding="utf-8"), flags=re.M)
    for lang in ("en", "de"):  # a word vocabulary of its own a side
        assert len((work / "prepared" / "bin" / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines()) <= 4000
    assert (work / "align.dict").stat().st_size > 0
    results = json.loads((work / "report.json").read_text())
    counts = results["unknown_words"]
    assert counts["unknown"] > 0 and counts["unknown"] == counts["by_dictionary"] + counts["copied"]
    assert results["sacrebleu_replace_unk"]["score"] >= results["sacrebleu"]["score"]
    report = (work / "report.md").read_text()
    assert "- sacrebleu: BLEU = " in report and "- sacrebleu_replace_unk: BLEU = " in report
    assert counts["text"] in report


def test_training_settings_are_what_fairseq_hydra_train_composes():
    """training_config reads the YAML files without hydra; its settings are the ones hydra composes
    for the recipe with the deepest defaults (multi30k_unk on multi30k_demo on paper)."""
    proc = subprocess.run(
        [str(BIN / "fairseq-hydra-train"), "--config-dir", CONFIG_DIR,
         "--config-name", "recipe/multi30k_unk", "task.data=unused", "checkpoint.save_dir=unused", "--cfg", "job"],
        cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    composed, config = OmegaConf.create(proc.stdout), training_config("multi30k_unk")
    for group, key in OPTIMIZATION:
        assert OmegaConf.select(config, f"{group}.{key}") == OmegaConf.select(composed, f"{group}.{key}"), (group, key)
    assert config.criterion.label_smoothing == 0.1 and config.model.dropout == 0.2  # the demo's, over paper.yaml's


def test_fairseq_options_give_fairseq_train_the_settings():
    """The options the tests and the benchmark's reference pass to fairseq-train set exactly the
    config's values (names and types as fairseq's parser reads them)."""
    from fairseq import options

    config = training_config("multi30k_demo")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused", "--user-dir", str(ROOT / "fairseq_convs2s_ext"), "--arch", "convs2s_tiny",
        "--criterion", "convs2s_cross_entropy", *fairseq_options(config)])
    for group, key in OPTIMIZATION:  # fairseq's argument is the key, or the group for its _name
        value = OmegaConf.select(config, f"{group}.{key}")
        assert getattr(args, group if key == "_name" else key) == (list(value) if OmegaConf.is_list(value) else value)
    assert args.optimizer == "nag" and args.lr == [0.25] and args.dropout == 0.2


def test_scoring_refuses_missing_hypotheses():
    with pytest.raises(score.ScoreError, match="3 hypotheses .* for 4 references"):
        score.check_counts(["a", "b", "c"], ["a", "b", "c", "d"], "hyp.txt", "ref.txt")
    assert score.bleu(["a small dog runs"], ["a small dog runs"])["score"] == 100.0


def _tar_gz(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_missing_corpus_is_downloaded_checked_and_extracted(tmp_path):
    """A corpus absent from the data folder is fetched from its source URL (here a file:// mirror)."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _tar_gz(mirror / "bitext.tgz", {"bitext/corpus.de-en.en": "a dog\n", "bitext/corpus.de-en.de": "ein Hund\n"})
    with gzip.open(mirror / "mono.en.gz", "wt") as f:
        f.write("hello\n")
    data = tmp_path / "data"
    archived = corpora._archived("demo", "bitext", f"file://{mirror}/bitext.tgz", "corpus.de-en.{lang}", ("en", "de"))
    prefix = archived.prefix(str(data))
    assert open(f"{prefix}.de").read() == "ein Hund\n"
    assert (data / "downloads" / "bitext.tgz").exists()
    gz = corpora.Corpus("demo", "mono", {"en": corpora.Source(url=f"file://{mirror}/mono.en.gz")})
    assert open(gz.prefix(str(data)) + ".en").read() == "hello\n"
    out = corpora.concatenate([archived, archived], str(data), str(tmp_path / "train"), ("en", "de"))
    assert open(f"{out}.en").read() == "a dog\na dog\n"


def test_corrupt_download_leaves_nothing_behind(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    good = gzip.compress(b"x" * 100000)
    (mirror / "broken.en.gz").write_bytes(good[: len(good) // 2])
    data = tmp_path / "data"
    corpus = corpora.Corpus("demo", "broken", {"en": corpora.Source(url=f"file://{mirror}/broken.en.gz")})
    with pytest.raises(DownloadError, match="incompletely or corrupt"):
        corpus.prefix(str(data))
    assert not (data / "demo" / "broken.en").exists()
    assert not any(p.name.startswith("broken") for p in (data / "downloads").iterdir())


@pytest.mark.parametrize("name", ["wmt16_en_ro", "multi30k_unk"])
def test_smoke_mode_trains_the_tiny_model(name):
    """The smoke overrides replace the recipe's architecture, not only its name: `model._name=`
    alone kept the 20 x 512 layers of convs2s_wmt_en_ro and made the smoke run train for hours."""
    from hydra import compose, initialize_config_dir

    import fairseq_convs2s_ext  # noqa: F401  (the model configs hydra composes from)
    from convs2s_recipes.run import SMOKE_OVERRIDES

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.1"):
        cfg = compose(config_name=f"recipe/{name}", overrides=["task.data=/unused", *SMOKE_OVERRIDES])
    assert cfg.model._name == "convs2s_tiny"
    assert (cfg.model.encoder_layers, cfg.model.decoder_layers) == ("[(32, 3)] * 2", "[(32, 3)] * 2")


def test_work_folder_is_in_the_current_folder(tmp_path, monkeypatch):
    """Not beside the package: an editable install's recipe run from another folder wrote its
    work folder into the checkout, a wheel's into site-packages."""
    monkeypatch.chdir(tmp_path)
    assert run.work_folder(run.parser().parse_args(["wmt16-en-ro", "--smoke"])) == str(tmp_path / "work" /
                                                                                     "wmt16-en-ro-smoke")
    assert run.work_folder(run.parser().parse_args(["gigaword", "--work", "w"])) == str(tmp_path / "w")


def test_data_root_is_found_from_the_current_folder(tmp_path, monkeypatch):
    """CONVS2S_DATA, else shared/data beside the current folder (a clone beside shared/, run
    from its root), else the user's cache: never a rule on where the package is installed."""
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "clone").mkdir()
    (tmp_path / "elsewhere" / "deeper").mkdir(parents=True)
    monkeypatch.delenv("CONVS2S_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path / "clone")
    assert corpora.data_root() == str(tmp_path / "shared" / "data")
    monkeypatch.chdir(tmp_path / "elsewhere" / "deeper")
    assert corpora.data_root() == str(tmp_path / "cache" / "convs2s")
    monkeypatch.setenv("CONVS2S_DATA", str(tmp_path / "mine"))
    assert corpora.data_root() == str(tmp_path / "mine")


def test_generate_runs_with_the_plugin_and_the_recipes_threads(tmp_path):
    """The recipe's fairseq-generate: this Python's fairseq, the plugin's absolute folder and
    task (fairseq's stock task is slower and lacks the plugin's generation), and the recipe's
    thread count in its environment."""
    recipe = run.RECIPES["multi30k-demo"]
    command, env = run.generate_command(recipe, "bin", "checkpoint.pt", Threads(3, "test"))
    assert command[:3] == [sys.executable, "-m", "fairseq_cli.generate"]
    assert command[command.index("--user-dir") + 1] == USER_DIR and os.path.isabs(USER_DIR)
    assert command[command.index("--task") + 1] == "convs2s_translation"
    assert env["OMP_NUM_THREADS"] == "3" and env["PATH"] == os.environ["PATH"]
    replace_unk, _ = run.generate_command(recipe, "bin", "checkpoint.pt", Threads(1, "test"), "align.dict")
    assert replace_unk[-4:] == ["--dataset-impl", "raw", "--replace-unk", "align.dict"]
    assert run._program(command) == "fairseq-generate"
