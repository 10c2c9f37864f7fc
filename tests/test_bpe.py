"""apply_bpe_file segments each distinct word once and maps the lines with lookups in a table
that forked workers share: its output must be subword-nmt's ``BPE.segment`` of every line,
byte for byte, on real text and on lines that a plausible shortcut would get wrong (two
spaces in a row, leading and trailing spaces, carriage returns, empty lines, whitespace
that is not a space, one-character words). Real subword-nmt, no mocks.
"""
import pytest
from subword_nmt.apply_bpe import BPE

from conftest import DATA
from convs2s_preprocess.bpe import SEPARATOR, apply_bpe_file, learn_joint_bpe

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
