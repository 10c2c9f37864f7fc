"""Tests of the alignment dictionary (convs2s-align-dict) for unknown-word replacement."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preprocess.align import (SEPARATOR, Aligner, aligned_pairs, build_align_dict, candidate_lines,
                              count_links, find_aligner, most_frequent, ranked_candidates,
                              write_aligner_input)
from preprocess.errors import PreprocessError
from preprocess.textio import read_lines
from preprocess.tokenize import tokenize_file

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("CONVS2S_DATA", REPO.parent / "shared" / "data"))
MULTI30K = DATA / "multi30k"


def write(path: Path, lines: list) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_counting_over_all_links_and_tie_breaking():
    pairs = [("the dog".split(), "der Hund".split()),
             ("the cat".split(), "die Katze".split()),
             ("the dog".split(), "der Hund".split()),
             ("a dog".split(), "ein Hund bellt".split())]
    alignments = ["0-0 1-1", "0-0 1-1", "0-0 1-1", "0-0 1-1 1-2"]
    counts = count_links(pairs, alignments)
    assert counts["the"] == {"der": 2, "die": 1}
    assert counts["dog"] == {"Hund": 3, "bellt": 1}
    assert most_frequent(counts) == {"the": "der", "dog": "Hund", "cat": "Katze", "a": "ein"}
    # equal counts: the lexicographically smallest target wins, whatever the order seen
    tie = count_links([("x".split(), "b a c".split())], ["0-2 0-0 0-1"])
    assert most_frequent(tie) == {"x": "a"}


def test_candidates_rank_aligned_targets_by_count():
    """--candidates: every aligned target of a source word, most frequent first, ties to the
    smaller word, with the counts (vocabulary selection's file)."""
    pairs = [("the dog".split(), "der Hund".split()),
             ("the cat".split(), "die Katze".split()),
             ("the dog".split(), "der Hund".split()),
             ("a dog".split(), "ein Hund bellt".split())]
    counts = count_links(pairs, ["0-0 1-1", "0-0 1-1", "0-0 1-1", "0-0 1-1 1-2 0-2"])
    assert ranked_candidates(counts)["dog"] == [("Hund", 3), ("bellt", 1)]
    assert ranked_candidates(counts, limit=1)["a"] == [("bellt", 1)]  # tie with "ein": smaller first
    assert list(candidate_lines(counts)) == ["a bellt 1 ein 1", "cat Katze 1", "dog Hund 3 bellt 1",
                                             "the der 2 die 1"]
    many = count_links([(["x"], [f"w{j}" for j in range(150)])], [" ".join(f"0-{j}" for j in range(150))])
    assert len(ranked_candidates(many)["x"]) == 150  # vocabulary selection reads up to the top 100


def test_alignment_output_must_fit_the_pairs():
    pairs = [("the dog".split(), "der Hund".split())]
    with pytest.raises(PreprocessError, match="line 1 .* does not fit"):
        count_links(pairs, ["0-0 2-1"])
    with pytest.raises(PreprocessError, match="differ in length"):
        count_links(pairs, ["0-0", "0-0"])


def test_separator_and_empty_pairs_are_left_out_in_sync(tmp_path):
    src = write(tmp_path / "src", ["the dog", "", "a ||| b", "two men", "   ", "a cat"])
    tgt = write(tmp_path / "tgt", ["der Hund", "leer", "x", "zwei Männer", "y", "eine|||Katze"])
    corpus = tmp_path / "corpus"
    assert write_aligner_input(src, tgt, str(corpus)) == 2
    assert corpus.read_text(encoding="utf-8") == \
        f"the dog {SEPARATOR} der Hund\ntwo men {SEPARATOR} zwei Männer\n"
    # reading the aligner's output back pairs line N with the same pair N
    assert list(aligned_pairs(src, tgt)) == [(["the", "dog"], ["der", "Hund"]),
                                             (["two", "men"], ["zwei", "Männer"])]


def test_nothing_left_to_align_is_an_error(tmp_path):
    src = write(tmp_path / "src", ["a ||| b", ""])
    tgt = write(tmp_path / "tgt", ["x", "y"])
    aligner = Aligner("eflomal", "eflomal-align")  # never started: the input is checked first
    with pytest.raises(PreprocessError, match="nothing to align"):
        build_align_dict(src, tgt, str(tmp_path / "align.dict"), aligner)
    assert sorted(os.listdir(tmp_path)) == ["src", "tgt"]


def test_missing_aligner_error_says_how_to_install(tmp_path):
    with pytest.raises(PreprocessError) as exc:
        find_aligner("auto", search_path=str(tmp_path))
    message = str(exc.value)
    assert "no word aligner found" in message
    assert "github.com/clab/fast_align" in message and "--fast-align PATH" in message
    assert "pip install eflomal" in message
    with pytest.raises(PreprocessError, match="not an executable file"):
        find_aligner("auto", fast_align=str(tmp_path / "fast_align"))


def _multi30k_tokenized(tmp_path: Path, n: int) -> tuple:
    """The first n Multi30k en-de training pairs, tokenized (cased), with an empty pair and
    a pair containing the separator inserted at line 10: the aligner must not see them."""
    paths = []
    for lang, extra in (("en", ["", "a ||| b"]), ("de", ["", "x"])):
        with open(MULTI30K / f"train.{lang}", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(n), f)]
        raw = write(tmp_path / f"raw.{lang}", lines)
        tokenize_file(raw, str(tmp_path / f"tok.{lang}"), lang)
        lines = list(read_lines(str(tmp_path / f"tok.{lang}")))
        paths.append(write(tmp_path / f"tok.{lang}", lines[:10] + extra + lines[10:]))
    return tuple(paths)


def _check_multi30k_dictionary(path: Path) -> None:
    entries = dict(line.split(" ") for line in read_lines(str(path)))
    assert entries["dog"] == "Hund"
    assert entries["man"] == "Mann"
    assert entries["woman"] == "Frau"
    assert entries["two"] == "zwei"
    assert entries["Two"] == "Zwei"  # cased input, cased dictionary
    assert "|||" not in entries and "a" in entries
    assert list(entries) == sorted(entries)


@pytest.mark.skipif(shutil.which("eflomal-align", path=os.pathsep.join(
                        [os.environ.get("PATH", ""), os.path.dirname(sys.executable)])) is None,
                    reason="eflomal-align not installed (pip install eflomal)")
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found under {DATA}")
def test_multi30k_dictionary_with_eflomal(tmp_path):
    src, tgt = _multi30k_tokenized(tmp_path, 3000)
    out = tmp_path / "align.dict"
    proc = subprocess.run([sys.executable, "-m", "preprocess.align", "--src", src, "--tgt", tgt,
                           "-o", str(out), "--aligner", "eflomal"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "aligning 3000 pairs" in proc.stderr and "(2 left out" in proc.stderr
    _check_multi30k_dictionary(out)
    assert sorted(os.listdir(tmp_path)) == ["align.dict", "raw.de", "raw.en", "tok.de", "tok.en"]


@pytest.mark.skipif(shutil.which("eflomal-align", path=os.pathsep.join(
                        [os.environ.get("PATH", ""), os.path.dirname(sys.executable)])) is None,
                    reason="eflomal-align not installed (pip install eflomal)")
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found under {DATA}")
def test_multi30k_candidates_with_eflomal(tmp_path):
    """convs2s-align-dict --candidates: the dictionary and, from the same counts, each source
    word's targets ranked by count, the first being its dictionary entry."""
    src, tgt = _multi30k_tokenized(tmp_path, 3000)
    out, candidates = tmp_path / "align.dict", tmp_path / "candidates"
    proc = subprocess.run([str(Path(sys.executable).parent / "convs2s-align-dict"), "--src", src,
                           "--tgt", tgt, "-o", str(out), "--aligner", "eflomal", "--candidates",
                           str(candidates)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    entries = dict(line.split(" ") for line in read_lines(str(out)))
    ranked = {}
    for line in read_lines(str(candidates)):
        source, *fields = line.split(" ")
        ranked[source] = [(t, int(n)) for t, n in zip(fields[0::2], fields[1::2])]
    assert list(ranked) == sorted(ranked) and set(ranked) == set(entries)
    for source, targets in ranked.items():
        assert targets[0][0] == entries[source]
        assert targets == sorted(targets, key=lambda item: (-item[1], item[0]))
    assert ranked["dog"][0] == ("Hund", max(n for _, n in ranked["dog"]))


@pytest.mark.skipif(shutil.which("fast_align") is None, reason="fast_align not on PATH")
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found under {DATA}")
def test_multi30k_dictionary_with_fast_align(tmp_path):
    src, tgt = _multi30k_tokenized(tmp_path, 3000)
    out = tmp_path / "align.dict"
    proc = subprocess.run([sys.executable, "-m", "preprocess.align", "--src", src, "--tgt", tgt,
                           "-o", str(out), "--fast-align", shutil.which("fast_align")],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    _check_multi30k_dictionary(out)
