"""Issue 34, item 5: the text functions of convs2s_preprocess under fuzzed input (hypothesis).

Any Unicode text (NUL, right-to-left and zero-width marks, combining characters, emoji)
goes through normalization, tokenization, cleaning, BPE and detokenization without an
exception, one line stays one line, and tokens are separated by single spaces and hold no
whitespace of any kind. Bytes that are not UTF-8 (lone surrogates, Latin-1)
are reported with the file and the line. Round trips, where Moses and subword-nmt promise
them:

- ``remove_bpe(apply_bpe(t)) == t`` for any tokenized text ``t`` (single spaces, no ``@@``).
- ``detokenize(tokenize(s)) == s`` for sentences of words of digits and the letters
  sacremoses knows (its copy of Perl's letter class, of an older Unicode: it splits ``0Ʝ``
  (U+A7B2) and ``0𐐀`` (U+10400) in two), single spaces, each word optionally followed by one of ``, . ! ? : ;``
  and optionally joined to the next by one hyphen, in English and German (the French
  detokenizer writes ``!``, ``?``, ``:`` and ``;`` after a space, as French typography does).
  Moses promises no more: ``tokenizer.perl`` drops control characters and splits
  punctuation in ways its detokenizer does not undo (``"``, ``'``, brackets, ``...``), and
  normalization replaces characters.
- ``tokenize(detokenize(tokenize(s))) == tokenize(s)`` for the same sentences.

Each property runs a few examples by default and many under ``-m slow``.
"""
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sacremoses import MosesTokenizer

from convs2s_preprocess.stages.bpe import apply_bpe, learn_joint_bpe, remove_bpe
from convs2s_preprocess.stages.clean import keep_pair
from convs2s_preprocess.errors import PreprocessError
from convs2s_preprocess.textio import count_lines, read_lines, write_lines
from convs2s_preprocess.stages.tokenize import detokenize, normalize_and_tokenize, tokenize, tokenize_file

EXAMPLES = [pytest.param(40, id="few"), pytest.param(1000, id="many", marks=pytest.mark.slow)]
LANGS = ["en", "de", "ro", "fr"]
HOSTILE = "\0\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202e\u2066\u2069\ufeff\u0301\u0308\u20dd" \
          "\U0001f600\U0001f1e9\U0001f1ea\u05d0\u0627\u0663\u2028\u2029\x85\x0b\x0c\x1c\r\t " \
          "@@|||&<>\"'`()[]{}.,;:!?-\u2013\u2014\u2026\u00a0\u3000"
# Any text without a line break, hostile characters over-represented.
LINE = st.text(st.one_of(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
                         st.sampled_from(HOSTILE)), max_size=80)
# Letters sacremoses knows (its copy of Perl's \p{IsAlpha}) and digits.
WORD = st.text(st.sampled_from(sorted(set(MosesTokenizer.IsAlpha) | set("0123456789"))), min_size=1, max_size=8)
# Simple sentences: see the module docstring.
SIMPLE = st.lists(st.tuples(WORD, st.sampled_from(["", ",", ".", "!", "?", ":", ";"]), st.booleans()),
                  min_size=1, max_size=12).map(
    lambda words: "".join(word + punct + ("-" if hyphen and not punct and i < len(words) - 1 else " ")
                          for i, (word, punct, hyphen) in enumerate(words)).rstrip())


def _property(examples):
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def codes(tmp_path_factory, data_dir):
    """BPE codes learned on 2000 tokenized Multi30k lines."""
    folder = tmp_path_factory.mktemp("bpe")
    paths = []
    for lang in ("en", "de"):
        lines = (data_dir / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:2000]
        write_lines(str(folder / lang), (tokenize(line, lang) for line in lines))
        paths.append(str(folder / lang))
    learn_joint_bpe(paths, str(folder / "codes"), 500)
    return str(folder / "codes")


@pytest.mark.parametrize("examples", EXAMPLES)
def test_any_line_survives_every_step_and_stays_one_line(examples, codes):
    @_property(examples)
    @given(LINE, st.sampled_from(LANGS))
    def check(line, lang):
        tokens = normalize_and_tokenize(line, lang, romanian=lang == "ro")
        # single spaces between tokens, none in them: BPE (which splits at " "), cleaning and
        # fairseq's dictionary (which split at any whitespace) count the same tokens
        assert tokens == " ".join(tokens.split()), repr(tokens)
        assert len(tokens.splitlines()) <= 1, repr(tokens)  # no U+2028, NEL... breaking a line
        segmented = apply_bpe(tokens, codes)
        assert len(segmented.splitlines()) <= 1
        assert remove_bpe(segmented) == tokens or "@@" in tokens
        keep_pair(tokens, segmented)
        assert "\n" not in detokenize(segmented, lang)
    check()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_bpe_round_trip(examples, codes):
    @_property(examples)
    @given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Z", "Cc")), min_size=1, max_size=12)
                    .filter(lambda w: "@@" not in w and w.split() == [w]), max_size=20))
    def check(words):
        text = " ".join(words)
        assert remove_bpe(apply_bpe(text, codes)) == text
    check()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_moses_round_trips_of_simple_sentences(examples):
    @_property(examples)
    @given(SIMPLE, st.sampled_from(["en", "de"]))
    def check(sentence, lang):
        tokens = tokenize(sentence, lang)
        assert detokenize(tokens, lang) == sentence, tokens
        assert tokenize(detokenize(tokens, lang), lang) == tokens
    check()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_invalid_bytes_are_reported_with_file_and_line(examples, tmp_path):
    bad = st.sampled_from([b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xff", b"\xc3", b"\xe9t\xe9", b"\xc0\xaf",
                           b"\xf8\x88\x80\x80\x80"])  # lone surrogates, Latin-1, overlong, 5 bytes
    good = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=20)

    @_property(examples)
    @given(st.lists(good, max_size=10), bad, good, st.lists(good, max_size=5))
    def check(before, invalid, around, after):
        path = tmp_path / "corpus.txt"
        path.write_bytes(b"".join(line.encode() + b"\n" for line in before) + around.encode() + invalid
                         + b"\n" + b"".join(line.encode() + b"\n" for line in after))
        with pytest.raises(PreprocessError, match=rf"^{path}, line {len(before) + 1}: not valid UTF-8 .*iconv"):
            list(read_lines(str(path)))
    check()


def test_a_line_of_a_megabyte_and_a_file_of_blank_lines(tmp_path, data_dir):
    text = (data_dir / "multi30k" / "train.en").read_text(encoding="utf-8").replace("\n", " ")[:1 << 20]
    src = tmp_path / "long"
    src.write_text(f"first line\n{text}\nlast line\n", encoding="utf-8")
    assert tokenize_file(str(src), str(tmp_path / "long.tok"), "en") == 3
    lines = list(read_lines(str(tmp_path / "long.tok")))
    assert lines[0] == "first line" and lines[2] == "last line"
    assert lines[1].split()[:4] == tokenize(text[:200], "en").split()[:4]

    blank = tmp_path / "blank"
    blank.write_text("\n" * 5000 + "  \n\t\n", encoding="utf-8")
    assert tokenize_file(str(blank), str(tmp_path / "blank.tok"), "de") == 5002
    assert (tmp_path / "blank.tok").read_text(encoding="utf-8") == "\n" * 5002


def test_reading_and_mapping_a_large_file_is_streamed(tmp_path):
    """Peak Python memory while 12 MB of lines are counted, read, mapped and written stays
    under 1% of the file: nothing holds the whole file."""
    path = tmp_path / "large"
    line = "ein Hund läuft über die grüne Wiese , und 12 Kinder spielen . " * 3
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(60_000):
            f.write(line + "\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        assert count_lines(str(path)) == 60_000
        assert write_lines(str(tmp_path / "upper"), map(str.upper, read_lines(str(path)))) == 60_000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 100, (size, peak)
