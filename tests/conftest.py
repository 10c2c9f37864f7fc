import sys
from pathlib import Path

import pytest

from convs2s_recipes.corpora import data_root

ROOT = Path(__file__).resolve().parents[1]
# Tests read real corpora from the recipes' data folder (CONVS2S_DATA, the Makefile's DATA=).
DATA = Path(data_root())
BIN = Path(sys.executable).parent  # the virtual environment's fairseq-* commands


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long real runs, excluded by default (run with -m slow)")


def pytest_collection_modifyitems(config, items):
    """Without a -m expression (`make test`), slow tests are skipped; `make test-slow` runs them."""
    if config.option.markexpr:
        return
    skip = pytest.mark.skip(reason="slow: run with `make test-slow` (pytest -m slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir():
    if not (DATA / "multi30k" / "train.en").exists():
        pytest.fail(f"corpora not found in {DATA}: set CONVS2S_DATA to the shared data folder")
    return DATA


@pytest.fixture(scope="session")
def small_bin(tmp_path_factory, data_dir):
    """300 training and 10 test pairs of Multi30k en-de, whitespace-split, binarized by
    fairseq-preprocess with a joint dictionary, the test text beside the binaries as fairseq's
    raw text (for --dataset-impl raw --replace-unk)."""
    from cli_helpers import run, write_lines

    work = tmp_path_factory.mktemp("small-data")
    for lang in ("en", "de"):
        lines = (data_dir / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        write_lines(work / f"train.{lang}", lines[:300])
        write_lines(work / f"test.{lang}", lines[300:310])
    run("fairseq-preprocess", "-s", "en", "-t", "de", "--trainpref", work / "train", "--validpref", work / "test",
        "--testpref", work / "test", "--destdir", work / "bin", "--joined-dictionary")
    for lang in ("en", "de"):
        (work / "bin" / f"test.en-de.{lang}").write_bytes((work / f"test.{lang}").read_bytes())
    return work / "bin"
