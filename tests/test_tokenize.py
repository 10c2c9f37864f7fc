"""Issue 35: the faster tokenizer gives sacremoses' text, line for line (no mocks).

``convs2s_preprocess.stages.tokenize`` runs sacremoses' normalizer and tokenizer through copies of
their steps that skip, reorder and rewrite rules for speed; each test here compares the text
with what sacremoses' own classes give: on real news and caption text in every language the
recipes tokenize, and on random text made of the characters those rewrites reason about.
"""
import functools
import itertools
import random
import re
import sys

import pytest
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from conftest import DATA
from convs2s_preprocess.stages.romanian import normalize_romanian_line
from convs2s_preprocess.textio import read_lines
from convs2s_preprocess.stages.tokenize import (FasterMosesTokenizer, FasterPunctNormalizer,
                                                normalize_and_tokenize, required_text, tokenize)


class SacremosesTokenizer(MosesTokenizer):
    """sacremoses' tokenizer, but for the sets of ``IsLower`` and ``IsAlpha``'s thousands of
    characters, built once, not on every call of ``islower`` and ``isanyalpha`` (0.3 ms each:
    the comparisons would take minutes)."""

    def __init__(self, lang: str):
        super().__init__(lang)
        self.lower, self.alpha = frozenset(self.IsLower), frozenset(self.IsAlpha)

    def islower(self, text):
        return not set(text).difference(self.lower)

    def isanyalpha(self, text):
        return any(set(text).intersection(self.alpha))


@functools.lru_cache(maxsize=None)
def sacremoses(lang: str):
    return MosesPunctNormalizer(lang), SacremosesTokenizer(lang)


def expected(line: str, lang: str, romanian: bool = False) -> str:
    """sacremoses' normalization and ``tokenizer.perl -a -no-escape``."""
    normalizer, tokenizer = sacremoses(lang)
    line = normalizer.normalize(line)
    line = normalize_romanian_line(line) if romanian else line
    return tokenizer.tokenize(line, aggressive_dash_splits=True, escape=False, return_str=True)


def mismatches(lines, lang, romanian=False):
    """The first few lines on which the two differ, with both texts."""
    return list(itertools.islice(
        ((line, want, got) for line in lines
         if (want := expected(line, lang, romanian)) != (got := normalize_and_tokenize(line, lang, romanian))),
        3))


# Each language's news (long sentences: commas, quotes, abbreviations, numbers) and captions.
REAL = [("en", False, ["wmt14-en-de/newstest2014.en", "multi30k/train.en", "ro-sts-en-ro/train.en"]),
        ("de", False, ["wmt14-en-de/newstest2013.de", "multi30k/train.de"]),
        ("fr", False, ["wmt14-en-fr/newstest2013.fr", "multi30k/train.fr"]),
        ("ro", True, ["wmt16-en-ro/newstest2016.ro", "ro-sts-en-ro/train.ro"]),
        ("ro", False, ["wmt16-en-ro/newsdev2016.ro"])]


@pytest.mark.parametrize("lang, romanian, files", REAL, ids=[f"{lang}{'-romanian' * r}" for lang, r, _ in REAL])
def test_same_text_as_sacremoses_on_real_text(lang, romanian, files):
    paths = [DATA / name for name in files]
    if not all(path.exists() for path in paths):
        pytest.skip(f"not all of {files} under {DATA}")
    lines = [line for path in paths for line in itertools.islice(read_lines(str(path)), 1200)]
    assert not mismatches(lines, lang, romanian)


# What the speed-ups reason about: commas and apostrophes close together, dots, the DOTMULTI
# marker, nonbreaking prefixes before lower case, digits and capitals, control characters,
# spaces other than " ", letters beyond the Basic Multilingual Plane, CJK, quotes the
# normalizer rewrites, and text made of them.
PIECES = list("aAzZsSéÉß5 0,,..''\"`-–—()[]{}<>!?:;%$@#&/\\|\t\n\r\x0b\x01\x1c\x1f\x7f\x85\xa0"
              "\u2009\u202f\u3000«»„“”‘’‚…´ºİ中文𐐀𝐀¹½") + [
    "Mr.", "No.", "no. 5", "U.S.", "e.g.", "pp. 3", "Art. 5", "n't", "'s", "'ll ", "'S", "5's",
    "...", " . ", ". a", ". A", ".'", "5,300", ",,", "'a'", "a'b'c", "l'homme", "d'", "DOTMULTI",
    "DOTDOTMULTI", "--", "''", "``", " cannot ", "THISISPROTECTED", "nº\xa0", "\xa0:", "\xa0»\xa0",
    "(\xa0", "  ", " %", "9 %"]


def random_lines(seed: int, count: int, real):
    """``count`` lines: random runs of PIECES, and real lines with PIECES put in."""
    rng = random.Random(seed)
    for _ in range(count // 2):
        yield "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        line = list(rng.choice(real))
        for _ in range(rng.randint(1, 6)):
            line.insert(rng.randint(0, len(line)), rng.choice(PIECES))
        yield "".join(line)


@pytest.mark.parametrize("lang, count", [("en", 2000), ("fr", 2000), ("de", 1000), ("ro", 1000),
                                         ("it", 1000), ("cs", 1000), ("zh", 60)])
def test_same_text_as_sacremoses_on_random_text(lang, count):
    """The normalizer, the tokenizer after it and the tokenizer alone (``tokenize`` is called
    on text nobody normalized), on random lines. Chinese (letters of its own in the classes;
    sacremoses takes 30 ms a line there) on a few."""
    real = ["Mr. Smith's dog, aged 5, didn't bark... (Really?) \"No,\" said O'Neil."]
    news = DATA / "wmt14-en-de" / "newstest2014.en"
    if news.exists():
        real += list(itertools.islice(read_lines(str(news)), 300))
    normalizer, tokenizer = sacremoses(lang)
    faster_normalizer, faster_tokenizer = FasterPunctNormalizer(lang), FasterMosesTokenizer(lang)
    options = dict(aggressive_dash_splits=True, escape=False, return_str=True)
    for line in random_lines(sum(map(ord, lang)), count, real):
        normalized = normalizer.normalize(line)
        assert faster_normalizer.normalize(line) == normalized, repr(line)
        for text in (line, normalized):
            assert faster_tokenizer.tokenize(text, **options) == tokenizer.tokenize(text, **options), repr(text)
        if lang != "zh":
            assert tokenize(line, lang) == tokenizer.tokenize(line, **options), repr(line)


def test_other_tokenizer_options_are_sacremoses_own():
    """Calls other than ``-a -no-escape`` (escaping, no hyphen splitting, a list of tokens)
    give sacremoses' text too."""
    line = "A well-known \"band\" & its fans' <3 | [x] didn't... pay $5,300."
    tokenizer, faster = MosesTokenizer("en"), FasterMosesTokenizer("en")
    for options in (dict(), dict(aggressive_dash_splits=True), dict(escape=False),
                    dict(aggressive_dash_splits=True, escape=False),
                    dict(aggressive_dash_splits=True, escape=False, return_str=True),
                    dict(protected_patterns=[r"<3"], escape=False, aggressive_dash_splits=True)):
        assert faster.tokenize(line, **options) == tokenizer.tokenize(line, **options), options


def test_what_the_whitespace_shortcut_assumes_holds_for_every_character():
    """The tokenizer collapses spaces only in text that ``str.isprintable`` says may hold a
    control character or a space other than " ": for every code point, ``re``'s ``\\s``
    is ``str.isspace`` (what ``str.split`` splits at), and neither a space other than " " nor
    a character sacremoses drops as ASCII junk is printable."""
    space = re.compile(r"\s")
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if char.isspace() or code < 32:
            assert bool(space.match(char)) == char.isspace() and (char == " " or not char.isprintable()), hex(code)
        else:
            assert not space.match(char), hex(code)


def test_required_text_is_text_every_match_contains():
    """The guard that lets the normalizer skip a rule is sound: the text named is in every
    match (a repeat's first m characters, not across a repeat with more, an alternative, a
    look-around or case-insensitive parts), and the longest such run."""
    needs = {r"(\d) %": " %", r" {2,}": "  ", r"(\.+)\"(\s*[^<])": ".\"", r"a{3}b": "aaab",
             r"x+?y": "xy", r"\) ([.!:?;,])": ") ", r"^``": "``", r"(?:x)?yz": "yz",
             r"(?i:k)mn": "mn", "\u00a0«\u00a0": "\u00a0«\u00a0", r"ab*c": "a", r"(?=q)zz": "zz"}
    for pattern, text in needs.items():
        assert required_text(pattern) == text, pattern
    for pattern in (r"[\000-\037]", r"a|b", r"x?", r"(?i)k", r"(?i:k)", r"(?=q)", r"\s+", r"(?:ab)+", ""):
        assert required_text(pattern) == "", pattern
    for pattern, text in needs.items():
        for match in re.finditer(pattern, "aaab xy xxy ) . ``a yz mn . \" \u00a0«\u00a0 9 % abbc zz"):
            assert text in match.group(), (pattern, match.group())
