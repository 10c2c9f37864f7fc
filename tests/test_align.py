"""Tests of the alignment dictionary (convs2s-align-dict) for unknown-word replacement."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preprocess.align import (SEPARATOR, Aligner, aligned_pairs, build_align_dict, count_links,
                              find_aligner, most_frequent, write_aligner_input)
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


needs_eflomal = pytest.mark.skipif(
    shutil.which("eflomal-align", path=os.pathsep.join(
        [os.environ.get("PATH", ""), os.path.dirname(sys.executable)])) is None,
    reason="eflomal-align not installed (pip install eflomal)")
needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(),
                                    reason=f"Multi30k not found under {DATA}")


def _align_dict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "preprocess.align", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True)


@needs_eflomal
@needs_multi30k
def test_multi30k_dictionary_with_eflomal(tmp_path):
    src, tgt = _multi30k_tokenized(tmp_path, 3000)
    out = tmp_path / "align.dict"
    proc = _align_dict("--src", src, "--tgt", tgt, "-o", out, "--aligner", "eflomal")
    assert proc.returncode == 0, proc.stderr
    assert "aligning 3000 pairs" in proc.stderr and "(2 left out" in proc.stderr
    _check_multi30k_dictionary(out)
    assert sorted(os.listdir(tmp_path)) == [".align.dict.built-from.json", "align.dict",
                                            "raw.de", "raw.en", "tok.de", "tok.en"]


@needs_eflomal
@needs_multi30k
def test_dictionary_is_rebuilt_when_inputs_or_options_change(tmp_path):
    src, tgt = _multi30k_tokenized(tmp_path, 300)
    out = tmp_path / "align.dict"
    args = ["--src", src, "--tgt", tgt, "-o", out, "--aligner", "eflomal"]
    assert _align_dict(*args).returncode == 0
    first = out.read_text(encoding="utf-8")
    proc = _align_dict(*args)
    assert proc.returncode == 0 and "alignment dictionary: reused" in proc.stderr
    assert "aligning" not in proc.stderr

    # Other sentences under the same paths: aligned again.
    full = {path: Path(path).read_text(encoding="utf-8") for path in (src, tgt)}
    for path, text in full.items():
        write(Path(path), text.splitlines()[:150])
    proc = _align_dict(*args)
    assert proc.returncode == 0, proc.stderr
    assert f"alignment dictionary: rebuilding: {src} changed; {tgt} changed" in proc.stderr
    second = out.read_text(encoding="utf-8")
    assert len(second.splitlines()) < len(first.splitlines())

    # An empty input fails, and says that the dictionary left in place is not from it.
    Path(src).write_text("")
    proc = _align_dict(*args)
    assert proc.returncode == 1
    assert f"input corpus is empty: {src}" in proc.stderr
    assert f"{out} left as an earlier run wrote them, not built from these" in proc.stderr
    assert out.read_text(encoding="utf-8") == second

    # Another aligner is another option: rebuilt (here with one that fails), not kept.
    write(Path(src), full[src].splitlines()[:150])
    proc = _align_dict("--src", src, "--tgt", tgt, "-o", out, "--fast-align",
                       shutil.which("false"))
    assert proc.returncode == 1
    assert "rebuilding: options changed: aligner: 'eflomal' -> 'fast_align'" in proc.stderr
    assert "fast_align failed with exit status 1" in proc.stderr
    assert out.read_text(encoding="utf-8") == second

    # The record still describes that dictionary: the inputs it was built from reuse it.
    proc = _align_dict(*args)
    assert proc.returncode == 0 and "alignment dictionary: reused" in proc.stderr


@pytest.mark.skipif(shutil.which("fast_align") is None, reason="fast_align not on PATH")
@needs_multi30k
def test_multi30k_dictionary_with_fast_align(tmp_path):
    src, tgt = _multi30k_tokenized(tmp_path, 3000)
    out = tmp_path / "align.dict"
    proc = _align_dict("--src", src, "--tgt", tgt, "-o", out, "--fast-align",
                       shutil.which("fast_align"))
    assert proc.returncode == 0, proc.stderr
    _check_multi30k_dictionary(out)
