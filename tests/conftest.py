import sys
from pathlib import Path

import pytest

from convs2s_recipes import corpora
from convs2s_recipes.download import DownloadError

ROOT = Path(__file__).resolve().parents[1]
# Tests read real corpora from the recipes' data folder (corpora.data_root: CONVS2S_DATA, the
# Makefile's DATA=, else ../shared/data where it exists, else ~/.cache/convs2s).
DATA = Path(corpora.data_root())
# What the default suite reads, fetched by pytest_sessionstart when missing: Multi30k en-de (the
# demo's), RO-STS en-ro and WMT16's newsdev2016/newstest2016 (the en-ro smoke recipe's).
SMOKE_EN_RO = corpora.EXPERIMENTS["wmt16-en-ro-smoke"]
MULTI30K = corpora.EXPERIMENTS["multi30k-en-de"]
TEST_CORPORA = (*MULTI30K.train, MULTI30K.valid, MULTI30K.test,
                *SMOKE_EN_RO.train, SMOKE_EN_RO.valid, SMOKE_EN_RO.test)
BIN = Path(sys.executable).parent  # the virtual environment's fairseq-* commands
# The longest any one command a test starts may take (a command that hangs fails the test).
COMMAND_TIMEOUT = 900


def pytest_sessionstart(session):
    """Before collection (some tests skip on what DATA holds): fetch the test corpora DATA lacks,
    or stop the run with one line (pytest's usage error: a setting is wrong, not a test) saying
    why they cannot be had."""
    missing = [path for c in TEST_CORPORA for lang in c.sources
               if not (path := DATA / c.folder / f"{c.name}.{lang}").exists()]
    if not missing:
        return
    session.config.get_terminal_writer().line(f"fetching {len(missing)} test corpus files missing from {DATA}")
    try:
        for corpus in TEST_CORPORA:
            corpus.prefix(str(DATA))
    except (DownloadError, OSError) as e:  # OSError: the folder cannot be written
        raise pytest.UsageError(f"the test corpora are not all in {DATA} and could not be fetched: {e}") from None


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long real runs, excluded by default (run with -m slow)")
    config.addinivalue_line("markers", "cuda: needs a CUDA device, skipped without one (make gpu-check runs them)")


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
    """The data folder, holding the test corpora (pytest_sessionstart fetched what it lacked)."""
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
