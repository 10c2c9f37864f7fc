"""Learning BPE and training fast_align's model on a sample of the corpus (issue 35).

What a sample costs the codes and the dictionary is measured by ``bench/sampling.py``; these
tests check that the sample is the one documented and that it is used as documented.
"""
import json
import logging
import re
import subprocess
import sys
from itertools import islice

import numpy as np
import pytest
from subword_nmt.learn_bpe import get_vocabulary, learn_bpe

from conftest import DATA, ROOT
from convs2s_preprocess.aligner import fastalign
from convs2s_preprocess.stages import bpe
from convs2s_preprocess.stages.align import Aligner, build_align_dict
from convs2s_preprocess.stages.bpe import learn_joint_bpe
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.pipeline import prepare
from convs2s_preprocess.textio import spread_evenly
from test_align import REFERENCE, needs_reference, write
from test_scaling import needs_data

MULTI30K = DATA / "multi30k"
needs_multi30k = pytest.mark.skipif(not (MULTI30K / "train.en").is_file(),
                                    reason=f"Multi30k not found in {DATA}")


@pytest.mark.parametrize("size,total", [(1, 7), (3, 7), (6, 7), (1000, 3000), (999, 1000),
                                        (7, 7), (9, 7), (0, 7)])
def test_spread_evenly_keeps_size_items_from_every_part(size, total):
    kept = list(spread_evenly(range(total), size, total))
    assert len(kept) == min(size, total)
    if 0 < size < total:
        step = total / size
        # the k-th kept item lies in the k-th of size equal parts of the items
        assert all(k * step <= i < (k + 1) * step for k, i in enumerate(kept))


def _lines(path, n):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in islice(f, n)]


@needs_multi30k
def test_bpe_learned_on_a_sample_is_subword_nmt_on_those_lines(tmp_path):
    """--bpe-sample 1000 of 3000 pairs: the codes subword-nmt learns from those pairs' text
    (lines 3, 6, 9, ... of each side), which differ from the codes of all 3000."""
    sides = {lang: _lines(MULTI30K / f"train.{lang}", 3000) for lang in ("en", "de")}
    paths = [write(tmp_path / f"train.{lang}", lines) for lang, lines in sides.items()]
    learn_joint_bpe(paths, str(tmp_path / "sampled"), 300, workers=2, sample=1000)
    learn_joint_bpe(paths, str(tmp_path / "all"), 300, workers=2)
    with open(tmp_path / "expected", "w", encoding="utf-8") as codes:
        learn_bpe([line + "\n" for lines in sides.values() for line in lines[2::3]], codes, 300)
    sampled = (tmp_path / "sampled").read_text(encoding="utf-8")
    assert sampled == (tmp_path / "expected").read_text(encoding="utf-8")
    assert sampled != (tmp_path / "all").read_text(encoding="utf-8")
    learn_joint_bpe(paths, str(tmp_path / "oversized"), 300, sample=5000)
    assert (tmp_path / "oversized").read_text(encoding="utf-8") == (tmp_path / "all").read_text(encoding="utf-8")


@needs_multi30k
@pytest.mark.parametrize("workers", [1, 2])
def test_bpe_max_words_learns_from_a_sample_that_holds_at_most_that_many(tmp_path, monkeypatch, caplog,
                                                                         workers):
    """--bpe-max-words 3000 of 2000 pairs that hold more words: the codes subword-nmt learns
    from an evenly spread sample of the pairs whose words are at most 3000 and more than
    2700 (found in a few counts); with 2 workers in two shards of the words."""
    monkeypatch.setattr(bpe, "SHARD_WORDS", 100)
    caplog.set_level(logging.INFO)
    sides = {lang: _lines(MULTI30K / f"train.{lang}", 2000) for lang in ("en", "de")}
    paths = [write(tmp_path / f"train.{lang}", lines) for lang, lines in sides.items()]
    words = len(get_vocabulary([line + "\n" for lines in sides.values() for line in lines]))

    learn_joint_bpe(paths, str(tmp_path / "bounded"), 300, workers=workers, max_words=3000)

    logged = re.search(r"learn BPE: 2000 lines hold (\d+) distinct words, more than --bpe-max-words 3000: "
                       r"learning from the (\d+) words of (\d+) lines spread evenly over them", caplog.text)
    assert logged and int(logged[1]) == words > 4000
    sample = int(logged[3])
    text = [line + "\n" for lines in sides.values() for line in spread_evenly(lines, sample, 2000)]
    assert 2700 < len(get_vocabulary(text)) == int(logged[2]) <= 3000
    with open(tmp_path / "expected", "w", encoding="utf-8") as codes:
        learn_bpe(text, codes, 300)
    assert (tmp_path / "bounded").read_text(encoding="utf-8") == (tmp_path / "expected").read_text(encoding="utf-8")
    learn_joint_bpe(paths, str(tmp_path / "enough"), 300, max_words=words)
    learn_joint_bpe(paths, str(tmp_path / "all"), 300, max_words=0)
    assert (tmp_path / "enough").read_text(encoding="utf-8") == (tmp_path / "all").read_text(encoding="utf-8")


def test_bpe_max_words_below_a_lines_words_is_one_error(tmp_path):
    """Three words on the one line and room for two: no sample holds two or fewer."""
    path = write(tmp_path / "text", ["a b c"])
    with pytest.raises(PreprocessError, match=f"--bpe-max-words 2 is fewer words than a line of {path} "
                                              "holds: give a larger number"):
        learn_joint_bpe([path], str(tmp_path / "codes"), 10, max_words=2)


def test_a_pair_the_sampled_table_lacks_gets_fast_aligns_missing_probability():
    """fast_align gives a word pair its table lacks t = 1e-9 (ttables.h): aligning text the
    model was not trained on, a lone unseen word still links to the diagonal, where 0 would
    leave it unlinked."""
    table = fastalign.TranslationTable(ids={fastalign.NULL: 1, "a": 2, "b": 3},
                                       keys=np.array([(2 << 32) | 3], dtype=np.int64),
                                       probs=np.array([0.5], dtype=np.float32))
    settings = fastalign.Settings(True, True, True)
    e, f = table.word_ids(["a", "zzz"])[:, None], table.word_ids(["b", "yyy"])[None, :]
    assert table.probabilities(e, f).tolist() == [[0.5, 0.0], [0.0, 0.0]]
    unseen = fastalign.UNSEEN_PROBABILITY
    assert table.probabilities(e, f, unseen)[0, 1] == pytest.approx(unseen)
    pairs = [(["zzz"], ["yyy"]), (["a", "zzz"], ["b", "yyy"])]
    assert fastalign.forward_links(pairs, table, 4.0, settings, unseen) == ["0-0", "0-0 1-1"]
    assert fastalign.forward_links(pairs, table, 4.0, settings) == ["", "0-0"]


def _reference_pairs(tmp_path, n):
    with open(REFERENCE / "corpus.en-de", encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split(" ||| ") for line in islice(f, n)]
    return (write(tmp_path / "src", [src for src, _ in pairs]),
            write(tmp_path / "tgt", [tgt for _, tgt in pairs]))


@needs_reference
def test_align_dict_trained_on_a_sample_aligns_every_pair_and_rebuilds_when_it_changes(tmp_path, caplog):
    src, tgt = _reference_pairs(tmp_path, 1500)
    aligner = Aligner("builtin", (sys.executable, "-m", "convs2s_preprocess.aligner.fastalign"))
    out = str(tmp_path / "align.dict")
    caplog.set_level(logging.INFO)
    scratch = tmp_path / "scratch"  # --tmpdir: the aligner's work folder goes there
    scratch.mkdir()
    assert build_align_dict(src, tgt, out, aligner, workers=2, train_sample=500, tmpdir=str(scratch))
    assert "training fast_align's model on 500 of the 1500 pairs" in caplog.text
    assert f"in {scratch}/.align-work-" in caplog.text and not list(scratch.iterdir())
    sampled = dict(line.split() for line in open(out, encoding="utf-8"))
    # every pair was aligned: words of pairs outside the sample are in the dictionary too
    outside = {word for i, line in enumerate(open(src, encoding="utf-8"))
               if (i + 1) % 3 for word in line.split()}
    outside -= {word for i, line in enumerate(open(src, encoding="utf-8"))
                if not (i + 1) % 3 for word in line.split()}
    assert len(outside & sampled.keys()) > 0.5 * len(outside)
    assert not build_align_dict(src, tgt, out, aligner, workers=2, train_sample=500)
    caplog.clear()
    assert build_align_dict(src, tgt, out, aligner, workers=1)  # the default: every pair of these
    assert "options changed: train_sample: 500 -> None" in caplog.text
    full = dict(line.split() for line in open(out, encoding="utf-8"))
    assert full != sampled and len(full) > len(sampled)  # rare words are lost first
    # a sample no smaller than the corpus is every pair: the same record, nothing rebuilt
    assert not build_align_dict(src, tgt, out, aligner, workers=2, train_sample=1500)
    assert not build_align_dict(src, tgt, out, aligner, workers=2, train_sample=0)


def test_a_missing_tmpdir_is_one_line(tmp_path):
    src, tgt = write(tmp_path / "src", ["a b"]), write(tmp_path / "tgt", ["c d"])
    with pytest.raises(PreprocessError, match="--tmpdir .*/nowhere: no such folder"):
        build_align_dict(src, tgt, str(tmp_path / "d"), Aligner("builtin", ("x",)),
                         tmpdir=str(tmp_path / "nowhere"))


def test_train_sample_is_refused_for_aligners_that_train_on_everything(tmp_path):
    src, tgt = write(tmp_path / "src", ["a b"]), write(tmp_path / "tgt", ["c d"])
    with pytest.raises(PreprocessError, match="--train-sample is the builtin aligner's: eflomal"):
        build_align_dict(src, tgt, str(tmp_path / "d"), Aligner("eflomal", ("eflomal-align",)),
                         train_sample=10)


@needs_multi30k
def test_prepare_bpe_sample_is_recorded_only_where_it_samples(tmp_path, caplog):
    """convs2s-prepare --bpe-sample: a sample smaller than the corpus relearns the codes
    (and so segments and binarizes again); one as large as the corpus changes nothing."""
    for lang in ("en", "de"):
        write(tmp_path / f"train.{lang}", _lines(MULTI30K / f"train.{lang}", 400))
    caplog.set_level(logging.INFO)
    run = dict(src_lang="en", tgt_lang="de", trainpref=str(tmp_path / "train"), bpe_merges=200,
               workers=1)
    prepare(str(tmp_path / "out"), **run)
    codes = (tmp_path / "out" / "bpe" / "codes").read_text(encoding="utf-8")
    caplog.clear()
    prepare(str(tmp_path / "out"), **run, bpe_sample=400)
    assert "learn BPE: rebuilding" not in caplog.text
    prepare(str(tmp_path / "out"), **run, bpe_sample=100)
    assert "learn BPE: rebuilding: options changed: sample: None -> 100" in caplog.text
    assert (tmp_path / "out" / "bpe" / "codes").read_text(encoding="utf-8") != codes


@needs_multi30k
def test_prepare_bpe_max_words_relearns_the_codes(tmp_path, caplog):
    """convs2s-prepare --bpe-max-words below the training text's words: the codes are learned
    again, from a sample (and differ); back to the default, the first codes come back."""
    for lang in ("en", "de"):
        write(tmp_path / f"train.{lang}", _lines(MULTI30K / f"train.{lang}", 400))
    caplog.set_level(logging.INFO)
    run = dict(src_lang="en", tgt_lang="de", trainpref=str(tmp_path / "train"), bpe_merges=200,
               workers=1)
    codes = tmp_path / "out" / "bpe" / "codes"
    prepare(str(tmp_path / "out"), **run)
    first = codes.read_text(encoding="utf-8")
    prepare(str(tmp_path / "out"), **run, bpe_max_words=500)
    assert f"learn BPE: rebuilding: options changed: max_words: {bpe.DEFAULT_MAX_WORDS} -> 500" in caplog.text
    assert "more than --bpe-max-words 500" in caplog.text and codes.read_text(encoding="utf-8") != first
    prepare(str(tmp_path / "out"), **run)
    assert codes.read_text(encoding="utf-8") == first


@needs_data
def test_sampling_benchmark_compares_bpe_bounded_by_words_with_the_full_codes(tmp_path):
    """bench.sampling's BPE part on 3,000 built pairs (a few seconds): a sample of pairs and
    the sample that --bpe-max-words 3000 chooses, each against the codes of every pair."""
    out = tmp_path / "sampling.json"
    proc = subprocess.run([sys.executable, "-m", "bench.sampling", "--only", "bpe", "--sizes", "--multi30k-samples",
                           "--bpe-sizes", "3000", "--bpe-samples", "1000", "--bpe-max-words", "3000",
                           "--merges", "300", "--json", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "<= 3,000 words" in proc.stdout and "1,000 pairs" in proc.stdout
    result = json.loads(out.read_text())["bpe"]["3000"]
    bounded = result["max_words"]["3000"]
    assert result["words"] > 3000 >= bounded["words_learned"] > 2700
    assert 0 < bounded["same_lines"] < 1 and 0 < result["samples"]["1000"]["same_lines"] < 1

