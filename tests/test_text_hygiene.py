"""Issue 51, goal 5: control characters and byte-order marks in raw text. Moses' tokenizer
deletes NUL and the other C0 controls, gluing the words they separated (``Mann\\0mit\\0Hut``
became the word ``MannmitHut``), and keeps a file's byte-order mark as part of its first word,
which reached the dictionary. Preprocessing now makes each such control character a space
and removes a byte-order mark at a line's start, and logs how many; text without them (DEL
and C1 controls included, which Moses keeps as tokens of their own) comes out byte for byte
as before."""
import itertools
import logging
import subprocess

import pytest

from conftest import BIN, DATA
from convs2s_preprocess.textio import read_lines, scrub
from convs2s_preprocess.stages.tokenize import normalize_and_tokenize, normalize_punctuation, tokenize, tokenize_file


@pytest.mark.parametrize("line, lang, tokens", [
    ("Ein Mann\0mit\0Hut.", "de", "Ein Mann mit Hut ."),
    ("\ufeffZwei Hunde spielen.", "de", "Zwei Hunde spielen ."),
    ("a\x01b\x1bc\x08d", "en", "a b c d"),
], ids=["NUL", "byte-order mark", "SOH, ESC, BS"])
def test_control_characters_become_spaces_and_a_leading_bom_goes(line, lang, tokens):
    assert normalize_and_tokenize(line, lang) == tokens


def test_text_without_them_is_unchanged():
    """Real lines of every language, and lines with the whitespace the tokenizer already
    splits at (tab, \\x1c-\\x1f, NEL), the DEL and C1 controls it keeps as tokens, or a mark
    inside a line (a zero-width no-break space)."""
    lines = ["a\tb", "a\x1cb\x1fc", "a\x85b", "Zwei\ufeffHunde", "Grüße, «Herr» Müller – 5 €", "pompiers\x96 qui",
             "a\x7fb"]
    for name in ("multi30k/train.de", "multi30k/train.fr", "wmt14-en-de/newstest2014.en",
                 "wmt16-en-ro/newstest2016.ro"):
        lines += list(itertools.islice(read_lines(str(DATA / name)), 2000))
    for line in lines:
        assert scrub(line) == line
        assert normalize_and_tokenize(line, "de") == tokenize(normalize_punctuation(line, "de"), "de")


def test_tokenizing_a_file_logs_what_was_changed(tmp_path, caplog):
    raw = tmp_path / "train.de"
    raw.write_bytes("\ufeffZwei Hunde.\nEin Mann\0mit\0Hut.\nOhne.\n".encode("utf-8"))
    with caplog.at_level(logging.INFO, logger="convs2s_preprocess.stages.tokenize"):
        assert tokenize_file(str(raw), str(tmp_path / "tok"), "de") == 3
    assert list(read_lines(str(tmp_path / "tok"))) == ["Zwei Hunde .", "Ein Mann mit Hut .", "Ohne ."]
    assert f"tokenize {raw}: 2 control characters (NUL, ...) became spaces, 1 byte-order marks at the start of a " \
           f"line were removed (the first: line 1)" in caplog.messages
    caplog.clear()
    (tmp_path / "clean.de").write_text("Zwei Hunde.\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="convs2s_preprocess.stages.tokenize"):
        tokenize_file(str(tmp_path / "clean.de"), str(tmp_path / "tok2"), "de")
    assert not [m for m in caplog.messages if "control characters" in m]


def test_prepare_s_dictionary_holds_the_words_not_glued_ones(tmp_path):
    """The words around a NUL and after a byte-order mark reach the dictionary as words."""
    for lang in ("en", "de"):
        lines = (DATA / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:200]
        if lang == "de":
            lines[0], lines[1] = "\ufeff" + lines[0], lines[1] + " Gurkenmann\0mit\0Gurkenhut"
        (tmp_path / f"train.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    proc = subprocess.run([str(BIN / "convs2s-prepare"), "-s", "en", "-t", "de", "--trainpref", tmp_path / "train",
                           "--no-bpe", "-o", tmp_path / "out", "--workers", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 control characters (NUL, ...) became spaces, 1 byte-order marks" in proc.stdout + proc.stderr
    words = {line.split()[0] for line in read_lines(str(tmp_path / "out" / "bin" / "dict.de.txt"))}
    assert {"Gurkenmann", "Gurkenhut"} <= words
    assert not [word for word in words if "\ufeff" in word or "Gurkenmannmit" in word]
