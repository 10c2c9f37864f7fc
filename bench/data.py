"""The benchmark's data: the `make demo` recipe's Multi30k en-de, prepared the same way.

``convs2s_recipes.run.prepare_data("multi30k-demo")``: Moses normalization and tokenization,
cleaning, 10,000 joint BPE merges, ``fairseq-preprocess --joined-dictionary``, the same
bytes as the demo's ``work/multi30k-demo/prepared``. It lives in a cache folder outside the
repository; the pipeline reuses what is still valid and rebuilds what is not.
"""
import os
from pathlib import Path

from convs2s_recipes.corpora import data_root
from convs2s_recipes.run import prepare_data

RECIPE = "multi30k-demo"


def cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convs2s-bench"


def prepare():
    """The fairseq data-bin folder of the demo recipe's Multi30k en-de (built if needed)."""
    _, _, _, data_bin = prepare_data(RECIPE, data_root(), str(cache_root() / RECIPE))
    return Path(data_bin)


def test_text(lang):
    """The raw test_2016_flickr lines (the references BLEU is computed against)."""
    from convs2s_recipes.corpora import EXPERIMENTS

    prefix = EXPERIMENTS["multi30k-en-de"].test.prefix(data_root())
    with open(f"{prefix}.{lang}", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


if __name__ == "__main__":
    print(prepare())
