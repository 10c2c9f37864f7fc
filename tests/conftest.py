import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Tests read real corpora from the data setting (the Makefile points it at ../shared/data).
DATA = Path(os.environ.get("CONVS2S_DATA", ROOT.parent / "shared" / "data"))
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
