"""Tests of the alignment dictionary (convs2s-align-dict) for unknown-word replacement."""
import gc
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from conftest import DATA, ROOT
from convs2s_preprocess.stages.align import (COUNT_CHUNK_LINES, FAST_ALIGN_SETTINGS, SEPARATOR, WORK_PREFIX,
                                             Aligner, build_align_dict, candidate_lines, count_corpus_links,
                                             count_links, count_partitions, find_aligner, most_frequent,
                                             ranked_candidates, write_aligner_input)
from convs2s_preprocess.aligner import fastalign
from convs2s_preprocess.stages import align
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.textio import read_lines
from convs2s_preprocess.stages.tokenize import tokenize_file
from faults import ctrl_c_as_a_terminal_sends_it, processes_mentioning, wait_until

MULTI30K = DATA / "multi30k"
# What the real fast_align binary wrote for Multi30k en-de (see its README): the input
# corpus, `fast_align -i corpus -d -o -v` (forward.links) and the dictionary from it.
REFERENCE = DATA / "fast_align-reference"
needs_reference = pytest.mark.skipif(not (REFERENCE / "forward.links").is_file(),
                                     reason=f"fast_align reference output not found in {DATA}")
EFLOMAL = shutil.which("eflomal-align", path=os.pathsep.join(
    [os.environ.get("PATH", ""), os.path.dirname(sys.executable)]))


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


def test_counts_are_partitioned_to_bound_each_worker_and_all_together():
    """The counts of a links file take about 4 bytes per byte of it: a worker's partition
    stays within 256 MiB, and on many workers, all of theirs within 4 GiB together."""
    gib = 2**30
    assert count_partitions(1000, 2) == 1
    assert count_partitions(4 * gib, 2) == 64  # 16 GiB of counts in 256 MiB pieces
    assert count_partitions(4 * gib, 16) == 64  # 16 x 256 MiB is 4 GiB
    assert count_partitions(4 * gib, 32) == 128  # 32 x 128 MiB
    assert count_partitions(1000 * gib, 2) == 512  # at most 512 partitions


@needs_reference
@pytest.mark.parametrize("partitions, chunk_lines", [(1, COUNT_CHUNK_LINES), (7, 997)])
def test_counting_in_workers_and_partitions_gives_the_binarys_dictionary(tmp_path, monkeypatch,
                                                                         partitions, chunk_lines):
    """A corpus' links are counted by workers, chunk by chunk, split by source word into
    partitions that are summed apart and merged: from the fast_align binary's own links of
    Multi30k, the dictionary is the one its README built from them, and the candidates are
    those of counting everything in one process, whatever the partitions and chunks."""
    monkeypatch.setattr(align, "COUNT_CHUNK_LINES", chunk_lines)
    out, candidates = tmp_path / "align.dict", tmp_path / "candidates"
    count_corpus_links(str(REFERENCE / "corpus.en-de"), str(REFERENCE / "forward.links"), str(tmp_path),
                       2, str(out), str(candidates), partitions)
    assert out.read_bytes() == (REFERENCE / "align.dict").read_bytes()
    counts = count_links(_reference_pairs(), read_lines(str(REFERENCE / "forward.links")))
    assert candidates.read_text(encoding="utf-8").splitlines() == list(candidate_lines(counts))


def test_aligner_output_that_does_not_fit_names_its_line_in_any_chunk(tmp_path):
    """The errors of the links counted in workers name the line in the whole file, past the
    first chunk too."""
    corpus = write(tmp_path / "corpus", [f"a b {SEPARATOR} c d"] * (COUNT_CHUNK_LINES + 5))
    line = COUNT_CHUNK_LINES + 3
    links = ["0-0 1-1"] * (COUNT_CHUNK_LINES + 5)
    links[line - 1] = "0-0 2-1"
    with pytest.raises(PreprocessError, match=f"alignment line {line} .* does not fit"):
        count_corpus_links(corpus, write(tmp_path / "bad", links), str(tmp_path), 2, str(tmp_path / "out"))
    with pytest.raises(PreprocessError, match=f"differ in length \\(from line {line} on\\)"):
        count_corpus_links(corpus, write(tmp_path / "short", links[:line - 1]), str(tmp_path), 2,
                           str(tmp_path / "out"))


def test_separator_and_empty_pairs_are_left_out_in_sync(tmp_path, monkeypatch):
    src = write(tmp_path / "src", ["the dog", "", "a ||| b", "two men", "   ", "a cat"])
    tgt = write(tmp_path / "tgt", ["der Hund", "leer", "x", "zwei Männer", "y", "eine|||Katze"])
    corpus = tmp_path / "corpus"
    assert write_aligner_input(src, tgt, str(corpus)) == 2
    assert corpus.read_text(encoding="utf-8") == \
        f"the dog {SEPARATOR} der Hund\ntwo men {SEPARATOR} zwei Männer\n"
    # the same in workers that read chunks of the files: line N of the aligner's input, and
    # of its output, is the same pair N
    monkeypatch.setattr(align, "INPUT_CHUNK_LINES", 2)
    assert write_aligner_input(src, tgt, str(tmp_path / "corpus2"), workers=2) == 2
    assert (tmp_path / "corpus2").read_bytes() == corpus.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["corpus", "corpus2", "src", "tgt"]


def test_nothing_left_to_align_is_an_error(tmp_path):
    src = write(tmp_path / "src", ["a ||| b", ""])
    tgt = write(tmp_path / "tgt", ["x", "y"])
    aligner = Aligner("eflomal", ("eflomal-align",))  # never started: the input is checked first
    with pytest.raises(PreprocessError, match="nothing to align"):
        build_align_dict(src, tgt, str(tmp_path / "align.dict"), aligner)
    assert sorted(os.listdir(tmp_path)) == ["src", "tgt"]


def test_missing_aligner_error_says_how_to_install(tmp_path):
    with pytest.raises(PreprocessError) as exc:
        find_aligner("fast_align", search_path=str(tmp_path))
    message = str(exc.value)
    assert "no word aligner found" in message
    assert "github.com/clab/fast_align" in message and "--fast-align PATH" in message
    with pytest.raises(PreprocessError, match="pip install eflomal"):
        find_aligner("eflomal", search_path=str(tmp_path))
    with pytest.raises(PreprocessError, match="not an executable file"):
        find_aligner("auto", fast_align=str(tmp_path / "fast_align"))
    with pytest.raises(PreprocessError, match="contradicts --aligner eflomal"):
        find_aligner("eflomal", fast_align=str(tmp_path / "fast_align"))


def test_default_without_binary_is_the_builtin_fast_align_model(tmp_path):
    aligner = find_aligner("auto", search_path=str(tmp_path))  # no fast_align binary there
    assert aligner == Aligner("builtin", (sys.executable, "-m", "convs2s_preprocess.aligner.fastalign"))
    assert aligner.options() == {"aligner": "builtin", "settings": "-d -o -v"}


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


needs_eflomal = pytest.mark.skipif(EFLOMAL is None, reason="eflomal-align not installed (pip install eflomal)")
needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(),
                                    reason=f"Multi30k not found under {DATA}")


def _align_dict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "convs2s_preprocess.stages.align", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("aligner", [
    "builtin",
    pytest.param("eflomal", marks=pytest.mark.skipif(
        EFLOMAL is None, reason="eflomal-align not installed (pip install eflomal)"))])
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found under {DATA}")
def test_multi30k_dictionary(tmp_path, aligner):
    src, tgt = _multi30k_tokenized(tmp_path, 3000)
    out = tmp_path / "align.dict"
    proc = subprocess.run([sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", src, "--tgt", tgt,
                           "-o", str(out), "--aligner", aligner],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"aligning 3000 pairs with {aligner}" in proc.stderr
    assert "(2 left out" in proc.stderr
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
                           str(candidates)], cwd=ROOT, capture_output=True, text=True)
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
@needs_multi30k
def test_multi30k_dictionary_with_fast_align(tmp_path):
    src, tgt = _multi30k_tokenized(tmp_path, 3000)
    out = tmp_path / "align.dict"
    proc = _align_dict("--src", src, "--tgt", tgt, "-o", out, "--fast-align",
                       shutil.which("fast_align"))
    assert proc.returncode == 0, proc.stderr
    _check_multi30k_dictionary(out)


# The builtin fast_align against the real binary's output on Multi30k ----------------

def _reference_pairs(n: Optional[int] = None) -> list:
    """The first n (all) pairs of the binary's input, as (source tokens, target tokens)."""
    with open(REFERENCE / "corpus.en-de", encoding="utf-8") as f:
        lines = list(islice(f, n))
    return [tuple(side.split() for side in line.split(f" {SEPARATOR} ")) for line in lines]


def _write_pairs(directory: Path, pairs: list) -> tuple:
    """Write pairs as the tokenized src/tgt files convs2s-align-dict reads."""
    directory.mkdir(exist_ok=True)
    return tuple(write(directory / name, [" ".join(pair[side]) for pair in pairs])
                 for side, name in enumerate(("src", "tgt")))


def _dictionary(pairs: list, links: list) -> dict:
    return most_frequent(count_links(pairs, links))


def _occurrence_agreement(pairs: list, ours: dict, reference: dict) -> float:
    """Share of the source-word occurrences whose entry is the same in both dictionaries
    (a word missing from both counts as the same)."""
    occurrences = Counter(word for src, _ in pairs for word in src)
    same = sum(n for word, n in occurrences.items() if ours.get(word) == reference.get(word))
    return same / sum(occurrences.values())


def _one_pair_decision(source: list, target: list, table, tension: float, settings, missing: float) -> str:
    """fast_align's forward decision as its module docstring writes it, one pair at a time."""
    n, m = len(source), len(target)
    e, f = table.word_ids([fastalign.NULL, *source]), table.word_ids(target)
    t = np.array([[table.probabilities(np.array([a]), np.array([b]), missing)[0] for b in f] for a in e])
    if settings.favor_diagonal:
        prior = np.exp(-tension * np.abs(np.arange(1, n + 1)[:, None] / n - np.arange(1, m + 1)[None, :] / m))
        prior *= (1 - fastalign.PROB_ALIGN_NULL) / prior.sum(axis=0)
        null_prior = fastalign.PROB_ALIGN_NULL
    else:
        prior = null_prior = np.float32(1 / (n + 1))
    scores = t[1:] * prior
    best = scores.argmax(axis=0)
    return " ".join(f"{best[j]}-{j}" for j in range(m) if scores[best[j], j] > t[0, j] * null_prior)


@pytest.mark.parametrize("favor_diagonal", [True, False])
@pytest.mark.parametrize("missing", [0.0, fastalign.UNSEEN_PROBABILITY])
def test_decoding_pairs_together_is_the_decision_pair_by_pair(favor_diagonal, missing):
    """Decoding a batch of pairs in one array gives every pair the links of its own
    decision: a random table (equal probabilities included, and pairs it lacks), pairs of
    1 to 12 words with words it does not know."""
    rng = np.random.default_rng(0)
    words = [fastalign.NULL, *(f"w{k}" for k in range(30))]
    ids = {word: number for number, word in enumerate(words, 1)}
    keys = np.unique(rng.integers(1, len(words) + 1, (400, 2)), axis=0)
    table = fastalign.TranslationTable(ids, (keys[:, 0] << 32) | keys[:, 1],
                                       rng.choice([0.5, 0.25, 0.1, 1e-3], len(keys)).astype(np.float32))
    vocabulary = [*words[1:], "unknown"]
    pairs = [tuple(list(rng.choice(vocabulary, rng.integers(1, 13))) for _ in range(2)) for _ in range(300)]
    settings = fastalign.Settings(favor_diagonal, True, True)
    links = fastalign.forward_links(pairs, table, 5.5, settings, missing)
    assert links == [_one_pair_decision(*pair, table, 5.5, settings, missing) for pair in pairs]
    assert sum(map(len, links)) > 1000 and links.count("") < 30


def _builtin_links(corpus: Path, *options: str) -> list:
    """Run `python -m convs2s_preprocess.aligner.fastalign -i corpus -d -o -v` and return its links."""
    proc = subprocess.run([sys.executable, "-m", "convs2s_preprocess.aligner.fastalign", "-i", str(corpus),
                           *FAST_ALIGN_SETTINGS, *options], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


SUBSET = 5000


@pytest.fixture(scope="module")
def subset_run(tmp_path_factory):
    """The first SUBSET reference pairs, their corpus file, and our links for them."""
    pairs = _reference_pairs(SUBSET)
    corpus = tmp_path_factory.mktemp("subset") / "corpus"
    write(corpus, [f"{' '.join(src)} {SEPARATOR} {' '.join(tgt)}" for src, tgt in pairs])
    return pairs, corpus, _builtin_links(corpus)


@needs_reference
def test_links_close_to_the_binary_on_a_subset(subset_run):
    """A fast, loose check: fast_align's model depends on the whole corpus, so a run on the
    first 5000 pairs is not the binary's 29,000-pair run and cannot equal it. Measured:
    90.5% of our links are the binary's and 91.3% of the binary's are ours, and the
    dictionaries from both sets of links agree on 96.1% of source-word occurrences. A
    symmetrized alignment (systran-align's grow-diag-final-and) gave 79% / 88% and 87.6%,
    eflomal 85% / 78% and 88.8%: the bounds below tell fast_align's forward alignment from
    those."""
    pairs, _, links = subset_run
    with open(REFERENCE / "forward.links", encoding="utf-8") as f:
        binary = [line.rstrip("\n") for _, line in zip(range(SUBSET), f)]
    assert len(links) == len(binary) == SUBSET
    shared = sum(len(set(a.split()) & set(b.split())) for a, b in zip(links, binary))
    assert shared / sum(len(a.split()) for a in links) > 0.88
    assert shared / sum(len(b.split()) for b in binary) > 0.88
    agreement = _occurrence_agreement(pairs, _dictionary(pairs, links), _dictionary(pairs, binary))
    assert agreement > 0.94


@needs_reference
def test_links_are_the_same_for_any_number_of_workers(subset_run):
    """The binary's threads add counts in a racy order, which changed one line of 5000 from
    run to run here; the builtin aligner's model, and so its links, are the same whatever the
    number of processes that train and decode (the fixture's run uses one)."""
    _, corpus, links = subset_run
    assert _builtin_links(corpus, "--workers", "3") == links


def _links_aligned_here(corpus: Path, workers: int) -> list:
    """fastalign.align (-d -o -v) in this process, so that a test can change its bounds."""
    out = io.BytesIO()
    try:
        fastalign.align(str(corpus), fastalign.Settings(True, True, True), out, workers=workers)
    finally:
        gc.unfreeze()
    return out.getvalue().decode("utf-8").splitlines()


@needs_reference
def test_workers_reading_chunks_of_the_corpus_write_the_links_of_one_process(subset_run, monkeypatch):
    """Each worker reads its chunk of the corpus and writes its links to a part file, which
    are joined in order: chunks of 7 pairs in 3 workers, against one chunk in one process."""
    _, corpus, links = subset_run
    monkeypatch.setattr(fastalign, "DECODE_CHUNK_LINES", 7)
    assert _links_aligned_here(corpus, workers=3) == links


@needs_reference
def test_links_do_not_depend_on_how_many_scores_are_decoded_at_once(subset_run, monkeypatch):
    """A worker decodes at most DECODE_SCORES scores at a time, which bounds its memory: at
    500 (a batch of a pair or two, and pairs larger than the bound alone) every link is the
    one the default bound gives."""
    _, corpus, links = subset_run
    monkeypatch.setattr(fastalign, "DECODE_SCORES", 500)
    assert _links_aligned_here(corpus, workers=2) == links


@needs_reference
def test_default_dictionary_is_the_fast_align_binarys(tmp_path):
    """The acceptance test: convs2s-align-dict with its default aligner on the binary's own
    input (29,000 pairs, a few seconds): every one of the 10,357 entries is the binary's."""
    pairs = _reference_pairs()
    src, tgt = _write_pairs(tmp_path / "data", pairs)
    out = tmp_path / "align.dict"
    proc = subprocess.run([sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", src, "--tgt", tgt,
                           "-o", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (REFERENCE / "align.dict").read_bytes()


@needs_reference
def test_progress_of_the_aligner_is_relayed_as_log_lines(tmp_path):
    """The child's training and decoding progress reaches convs2s-align-dict's log, with
    rates, as lines: a log file of it holds no carriage-return bar."""
    src, tgt = _write_pairs(tmp_path / "data", _reference_pairs(1500))
    proc = subprocess.run([sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", src, "--tgt", tgt,
                           "-o", str(tmp_path / "align.dict"), "--workers", "2"], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, CONVS2S_PROGRESS_SECONDS="0"))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\| train fast_align's model: 9,000/9,000 pair passes \(100%\), [\d,]+ pair "
                     r"passes/s in \d", proc.stderr), proc.stderr
    assert re.search(r"\| train fast_align's model: [\d,]+/9,000 pair passes \(\d\d?%\), [\d,]+ pair "
                     r"passes/s, about \d+:\d\d:\d\d left", proc.stderr), proc.stderr  # before the end
    assert re.search(r"\| align: 1,500/1,500 pairs \(100%\), [\d,]+ pairs/s in \d", proc.stderr)
    assert "\r" not in proc.stderr


# A killed convs2s-align-dict leaves no aligner running and no work folder ---------------

def _start_aligning(tmp_path: Path, *options, processes: int = 1) -> tuple:
    """Start convs2s-align-dict on the 29,000 reference pairs 4 times over (the builtin
    aligner takes some 15 s on 2 cores) and return it, its output folder and the marker of
    its aligner's command lines, once that many aligner processes run (eflomal-align starts
    an `eflomal` binary) and have run for a second."""
    src, tgt = _write_pairs(tmp_path / "data", _reference_pairs() * 4)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with open(tmp_path / "stderr", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", src, "--tgt", tgt,
             "-o", str(out_dir / "align.dict"), *options], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=log,
            preexec_fn=ctrl_c_as_a_terminal_sends_it)
    marker = str(out_dir / WORK_PREFIX)  # in the aligner's arguments, not in the command's
    assert wait_until(lambda: len(processes_mentioning(marker)) >= processes, 60), \
        "the aligner did not start"
    time.sleep(1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    return proc, out_dir, marker


def _kill_and_check_aligner_stops(proc, sig, marker: str) -> None:
    aligners = processes_mentioning(marker)
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    assert wait_until(lambda: not processes_mentioning(marker), 10), \
        f"aligner processes {aligners} still running after {sig.name} of convs2s-align-dict"


@needs_reference
@pytest.mark.parametrize("aligner, processes", [
    pytest.param("builtin", 1, id="builtin"),
    pytest.param("eflomal", 2, id="eflomal", marks=pytest.mark.skipif(
        EFLOMAL is None, reason="eflomal-align not installed (pip install eflomal)"))])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopped_run_stops_its_aligner_and_removes_its_files(tmp_path, sig, aligner, processes):
    """eflomal-align runs an `eflomal` binary of its own: it is stopped too. The builtin
    aligner's shard folder, which a rerun resumes from, is all that is left."""
    proc, out_dir, marker = _start_aligning(tmp_path, "--aligner", aligner, processes=processes)
    _kill_and_check_aligner_stops(proc, sig, marker)
    assert proc.returncode != 0
    assert os.listdir(out_dir) == ([".align.dict.shards"] if aligner == "builtin" else [])
    if sig == signal.SIGINT:  # Ctrl-C: one line, which says where the rerun resumes from
        kept = f"; what it finished is kept in {out_dir / '.align.dict.shards'} for a rerun"
        assert (tmp_path / "stderr").read_text().splitlines()[-1] == \
            "interrupted: the aligner was stopped and its work folder removed" + \
            (kept if aligner == "builtin" else "")


@needs_reference
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killed_run_stops_its_aligner_and_next_run_removes_its_folder(tmp_path):
    proc, out_dir, marker = _start_aligning(tmp_path)
    _kill_and_check_aligner_stops(proc, signal.SIGKILL, marker)
    # nothing catches SIGKILL: the work folder (and the half-written output) stay...
    leftovers = sorted(os.listdir(out_dir))
    assert [name for name in leftovers if name.startswith(WORK_PREFIX)], leftovers
    # ...until the next run in that folder, here on a small corpus
    src, tgt = _write_pairs(tmp_path / "small", _reference_pairs(200))
    run = subprocess.run([sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", src, "--tgt", tgt,
                          "-o", str(out_dir / "align.dict")], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert "which was killed" in run.stderr
    assert sorted(os.listdir(out_dir)) == [".align.dict.built-from.json", "align.dict"]
