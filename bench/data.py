"""The benchmark's data: Multi30k en-de prepared by the recipes' pipeline, in a cache folder.

- ``demo``: the ``make demo`` recipe's data (``convs2s_recipes.run.prepare_data("multi30k-demo")``:
  Moses normalization and tokenization, cleaning, 10,000 joint BPE merges, one joined
  dictionary), the same bytes as the demo's ``work/multi30k-demo/prepared``.
- ``words``: the same text at word level with every training word in the dictionaries (about
  10k English and 18k German types), the setting of the paper's word-level models, where
  vocabulary selection pays most.

The pipeline reuses what is still valid and rebuilds what is not. With vocabulary selection,
the candidates file is built by ``convs2s-align-dict --candidates`` from the training text the
dictionaries were built on (BPE-segmented for ``demo``), also cached and rebuilt when it changes.
"""
import dataclasses
from pathlib import Path

from convs2s_preprocess.runtime.host import cache_folder
from convs2s_recipes.corpora import data_root
from convs2s_recipes.run import RECIPES, prepare_data

RECIPE = "multi30k-demo"  # whose training settings the benchmark uses (bench/training.py)
DATASETS = {
    "demo": RECIPES[RECIPE],
    "words": dataclasses.replace(RECIPES[RECIPE], bpe_merges=None, nwords=-1, joined_dictionary=False),
}


def cache_root():
    return Path(cache_folder("convs2s-bench"))


def prepared_folder(name):
    return cache_root() / f"multi30k-{name}" / "prepared"


def prepare(name="demo"):
    """The fairseq data-bin folder of data set ``name`` (built if needed)."""
    _, _, _, data_bin = prepare_data(DATASETS[name], data_root(), str(prepared_folder(name).parent))
    return Path(data_bin)


def candidates(name="demo", src="en", tgt="de"):
    """The candidates file of data set ``name`` for ``--vocab-selection`` (built if needed)."""
    from convs2s_preprocess.stages.align import build_align_dict, find_aligner

    prepared = prepared_folder(name)
    train = prepared / "bpe" / "train" if DATASETS[name].bpe_merges else prepared / "tok" / "train.clean"
    out = prepared.parent / "candidates"
    build_align_dict(f"{train}.{src}", f"{train}.{tgt}", str(prepared.parent / "align.dict"), find_aligner(),
                     str(out))
    return out


def test_text(lang, split="test"):
    """The raw lines of test_2016_flickr (the references BLEU is computed against), or of
    Multi30k's validation set with ``split="valid"``."""
    from convs2s_recipes.corpora import EXPERIMENTS

    prefix = getattr(EXPERIMENTS["multi30k-en-de"], split).prefix(data_root())
    with open(f"{prefix}.{lang}", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


if __name__ == "__main__":
    print(prepare())
