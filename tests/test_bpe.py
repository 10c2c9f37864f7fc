"""learn_joint_bpe learns subword-nmt's codes with a faster search for the most frequent pair,
and apply_bpe_file segments each distinct word once and maps the lines with lookups in a table
that forked workers share: its output must be subword-nmt's ``BPE.segment`` of every line,
byte for byte, on real text and on lines that a plausible shortcut would get wrong (two
spaces in a row, leading and trailing spaces, carriage returns, empty lines, whitespace
that is not a space, one-character words). Real subword-nmt, no mocks.
"""
import contextlib
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import threading

import pytest
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

from conftest import DATA
from convs2s_preprocess.stages import bpe
from convs2s_preprocess.stages.bpe import SEPARATOR, apply_bpe_file, learn_joint_bpe
from convs2s_preprocess.runtime.host import descendants
from faults import ENV

MULTI30K = DATA / "multi30k"
# Lines enough for several batches of lines and of distinct words, so that both workers
# map lines and segment words.
LINES = 12000
HOSTILE = [
    "", " ", "  ", "a", "a b  c", "  leading and trailing  ", "two  spaces   three",
    "\rcarriage returns\r inside\r", "tab\tis not a separator", "no\u00a0break\u2003spaces",
    "ünïcödé wörter Straßenmusikantinnen 中文 🙂", "x y z . , ! ?", "@@ at@@ signs@@",
    "vertical\x0btab and\x1cfile separator", " \r \r ",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(text, codes, the text segmented by subword-nmt): codes learned on a part of the text."""
    if not MULTI30K.is_dir():
        pytest.skip(f"Multi30k not found under {DATA}")
    with open(MULTI30K / "train.de", encoding="utf-8") as f:
        real = [line.rstrip("\n") for _, line in zip(range(LINES), f)]
    lines = HOSTILE + real[:LINES // 2] + HOSTILE + real[LINES // 2:] + HOSTILE
    folder = tmp_path_factory.mktemp("bpe")
    text, part, codes = folder / "text", folder / "part", folder / "codes"
    text.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    part.write_bytes("".join(line + "\n" for line in real[:2000]).encode("utf-8"))
    learn_joint_bpe([str(part)], str(codes), 300)
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f, separator=SEPARATOR)
    return text, codes, "".join(bpe.segment(line) + "\n" for line in lines).encode("utf-8")


@pytest.mark.parametrize("workers", [1, 2])
def test_apply_bpe_file_is_subword_nmts_segment_of_every_line(corpus, tmp_path, workers):
    text, codes, expected = corpus
    out = tmp_path / "out"

    assert apply_bpe_file(str(codes), str(text), str(out), workers) == expected.count(b"\n")

    got = out.read_bytes()
    assert got.split(b"\n") == expected.split(b"\n")  # shows the first line that differs
    assert got.count(b"@@ ") > LINES  # the codes split words: the table is used


@pytest.mark.parametrize("workers", [1, 2])
def test_words_whose_hashes_collide_are_segmented_all_the_same(corpus, tmp_path, monkeypatch, workers):
    """The table that the workers share finds a word by its hash: with a hash that makes
    most words collide (their length), split words with split or whole ones, every line is
    still subword-nmt's. Python's own hash makes such words rare, not impossible."""
    text, codes, expected = corpus
    monkeypatch.setattr(bpe, "_hash", len)
    out = tmp_path / "out"

    apply_bpe_file(str(codes), str(text), str(out), workers)

    assert out.read_bytes().split(b"\n") == expected.split(b"\n")


@pytest.mark.parametrize("lines, merges, workers", [(2000, 3000, 1), (2000, 3000, 2), (2000, 3000, 3),
                                                    (300, 100000, 1), (300, 100000, 2)])
def test_learned_codes_are_subword_nmts(tmp_path, monkeypatch, lines, merges, workers):
    """The merge loop keeps subword-nmt's helpers and pruning but files the pairs by frequency
    instead of reading them all for each merge: the codes must still be subword-nmt's, line
    for line. 2000 lines and 3000 merges go through a rebuild of the pruned statistics;
    300 lines run out of pairs that occur twice, through many ties (largest pair first).
    With 2 workers the words of the two files are counted in chunks of 700 lines that each
    worker reads itself; with 2 or 3 the merges are made in as many shards of the words."""
    if not MULTI30K.is_dir():
        pytest.skip(f"Multi30k not found under {DATA}")
    monkeypatch.setattr(bpe, "COUNT_CHUNK_LINES", 700)
    monkeypatch.setattr(bpe, "SHARD_WORDS", 100)
    text, paths = [], [tmp_path / "text.en", tmp_path / "text.de"]
    for lang, path in zip(("en", "de"), paths):
        with open(MULTI30K / f"train.{lang}", encoding="utf-8") as f:
            part = [line for _, line in zip(range(lines), f)]
        if lang == "de":
            part += [line + "\n" for line in HOSTILE + ["x \rword \r\rword \rword"]] * 3
        path.write_bytes("".join(part).encode("utf-8"))
        text += part
    codes, reference = tmp_path / "codes", io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):
        learn_bpe(text, reference, merges)

    learn_joint_bpe([str(path) for path in paths], str(codes), merges, workers=workers)

    assert codes.read_bytes().decode("utf-8").split("\n") == reference.getvalue().split("\n")
    assert reference.getvalue().count("\n") > 2000


def test_codes_of_words_without_pairs_are_empty(tmp_path):
    """Words of one character have no pair to merge: subword-nmt's learn_bpe fails on them
    (max() of nothing); the codes are the header alone."""
    path, codes = tmp_path / "text", tmp_path / "codes"
    path.write_text("a b\nc\n\n", encoding="utf-8")

    learn_joint_bpe([str(path)], str(codes), 10)

    assert codes.read_text(encoding="utf-8") == "#version: 0.2\n"


def test_shards_hold_at_least_shard_words_dealt_in_turn(monkeypatch):
    """250 words and 3 workers at hand, shards of at least 100 words: two shards, this
    process's and one worker's, each with every other word from the most frequent; the other
    workers get nothing and are not asked."""
    monkeypatch.setattr(bpe, "SHARD_WORDS", 100)
    vocab = [((f"w{i}",), 1000 - i) for i in range(250)]
    pipes = [multiprocessing.Pipe() for _ in range(3)]

    words = bpe.WordShards(vocab, [here for here, _ in pipes])

    assert words.vocab == vocab[::2] and pipes[0][1].recv() == vocab[1::2]
    assert words.connections == [pipes[0][0]] and not pipes[1][1].poll() and not pipes[2][1].poll()


def test_a_killed_merge_worker_stops_learning_with_one_line(tmp_path):
    """convs2s-prepare --workers 3 learns the merges in this process and 2 workers, each
    with a shard of the words (of 1,000 words at least here, not SHARD_WORDS: Multi30k has
    fewer): SIGKILL of one of them while the merges are learned (the OOM killer's way) stops
    the command with one line naming the stage, and no codes; neither a hang waiting for its
    answer nor a traceback."""
    if not MULTI30K.is_dir():
        pytest.skip(f"Multi30k not found under {DATA}")
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_bytes((MULTI30K / f"train.{lang}").read_bytes())
    out = tmp_path / "out"
    prepare = ("from convs2s_preprocess import pipeline; from convs2s_preprocess.stages import bpe; "
               "bpe.SHARD_WORDS = 1000; pipeline.main()")
    proc = subprocess.Popen([sys.executable, "-c", prepare, "-s", "en", "-t", "de", "--trainpref", tmp_path / "train",
                             "-o", out, "--workers", "3"],
                            cwd=tmp_path, env={**ENV, "CONVS2S_PROGRESS_SECONDS": "0"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    hang = threading.Timer(300, proc.kill)  # a command waiting for ever fails the test
    hang.start()
    try:
        for line in proc.stderr:  # every merge is logged: the command waits for this reader
            if "| learn BPE: 1/" in line:  # the first merge is made
                break
        workers = descendants(proc.pid)
        assert len(workers) == 2, f"not 2 merge workers: {workers}"
        os.kill(workers[0], signal.SIGKILL)
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        hang.cancel()

    assert proc.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1] == "error: learn BPE: a worker process stopped before answering"
    assert not (out / "bpe" / "codes").exists()
