"""Moses punctuation normalization, tokenization and detokenization (sacremoses).

The paper (section 4) follows Sennrich et al.'s WMT16 preprocessing: per line,
``normalize-punctuation.perl -l LANG``, then for Romanian ``normalise-romanian.py`` and
``remove-diacritics.py``, then ``tokenizer.perl -a -l LANG`` (``-a``: aggressive hyphen
splitting, ``well-known`` -> ``well @-@ known``). Here those are sacremoses' ports;
special characters are not escaped (no ``&amp;``), so detokenization does not unescape.

Tokenizing is the longest stage of preparing a WMT corpus, so sacremoses' classes run here
through subclasses that give the same text in about half the time (each pattern compiled
once, each rule skipped on a line without a character all its matches need), and a file's
lines go to every core in batches (:mod:`.parallel`).
"""
import functools
import re

try:  # the parser that re.compile uses
    from re import _constants, _parser
except ImportError:  # Python < 3.11
    import sre_constants as _constants
    import sre_parse as _parser
from typing import Optional

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from .parallel import map_file
from .romanian import normalize_romanian_line
from .textio import map_lines


def required_literal(pattern: str, flags: int = 0) -> Optional[str]:
    """A character that every match of ``pattern`` contains, or None if none is evident:
    a literal (or a class of one character) among the pattern's top-level elements or a
    group's, not under a repeat, an alternative or a look-around."""
    if flags & re.IGNORECASE:
        return None
    try:
        parsed = _parser.parse(pattern, flags)
    except (re.error, RecursionError):
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None

    def first(items) -> Optional[str]:
        for op, value in items:
            if op is _constants.LITERAL:
                return chr(value)
            if op is _constants.IN and len(value) == 1 and value[0][0] is _constants.LITERAL:
                return chr(value[0][1])
            if op is _constants.SUBPATTERN and not value[1] & re.IGNORECASE \
                    and (found := first(value[-1])):
                return found
        return None
    return first(parsed)


class RequiredLiteral:
    """A compiled pattern whose ``sub`` leaves alone, without running the pattern, the text
    that lacks a character every match contains (the pattern would give that same text)."""

    def __init__(self, pattern: re.Pattern, literal: str):
        self.pattern, self.literal = pattern, literal

    def sub(self, substitution, text: str) -> str:
        return self.pattern.sub(substitution, text) if self.literal in text else text

    def __getattr__(self, name: str):  # search, findall, ... as the pattern's
        if name == "pattern":
            raise AttributeError(name)
        return getattr(self.pattern, name)


def guarded(pattern) -> object:
    """``pattern`` (text or compiled), compiled, wrapped in :class:`RequiredLiteral` where
    every match needs a character."""
    pattern = re.compile(pattern)
    literal = required_literal(pattern.pattern, pattern.flags)
    return RequiredLiteral(pattern, literal) if literal else pattern


class FasterPunctNormalizer(MosesPunctNormalizer):
    """sacremoses' punctuation normalizer, the same substitutions in the same order, faster.

    Its ``normalize`` calls ``re.sub(pattern_string, ...)`` for each of about 45 patterns on
    every line: each call looks its pattern up in ``re``'s cache (a fifth of the time of
    normalizing and tokenizing a line, cProfile on 3000 lines of newstest2013), and most
    patterns need a character the line does not hold (a curly quote, a non-breaking space).
    Here each pattern is compiled once and skipped on a line without its character
    (:func:`guarded`).
    """

    def __init__(self, lang: str):
        super().__init__(lang)
        self.compiled = [(guarded(pattern), substitution)
                         for pattern, substitution in self.substitutions]

    def normalize(self, text: str) -> str:
        if self.pre_replace_unicode_punct or self.post_remove_control_chars:
            return super().normalize(text)
        for pattern, substitution in self.compiled:
            text = pattern.sub(substitution, text)
        return text.strip()


def _is_rule(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], re.Pattern)


class FasterMosesTokenizer(MosesTokenizer):
    """sacremoses' tokenizer, the same rules, run less often.

    - A rule whose every match needs a character is skipped on a line without it
      (:func:`guarded`): the apostrophe, hyphen and comma rules, about half its time on
      English news (their character classes hold thousands of characters), run only on
      lines with an apostrophe, a hyphen or a comma.
    - ``islower`` and ``isanyalpha`` (asked of a token before a full stop) build a set of
      the thousands of characters of ``IsLower`` or ``IsAlpha`` on every call, about
      0.3 ms each; here each set is built once.

    ``tests/test_preprocess.py`` compares its output with sacremoses' on real files.
    """

    def __init__(self, lang: str):
        super().__init__(lang)
        for name in dir(self):
            value = getattr(self, name) if name.isupper() else None
            if _is_rule(value):
                setattr(self, name, (guarded(value[0]), value[1]))
            elif isinstance(value, list) and value and all(map(_is_rule, value)):
                setattr(self, name, [(guarded(pattern), sub) for pattern, sub in value])

    @functools.cached_property
    def lower_characters(self) -> frozenset:
        return frozenset(self.IsLower)

    @functools.cached_property
    def alpha_characters(self) -> frozenset:
        return frozenset(self.IsAlpha)

    def islower(self, text: str) -> bool:
        return not set(text).difference(self.lower_characters)

    def isanyalpha(self, text: str) -> bool:
        return any(set(text).intersection(self.alpha_characters))


@functools.lru_cache(maxsize=None)
def _normalizer(lang: str) -> MosesPunctNormalizer:
    return FasterPunctNormalizer(lang)


@functools.lru_cache(maxsize=None)
def _tokenizer(lang: str) -> MosesTokenizer:
    return FasterMosesTokenizer(lang)


@functools.lru_cache(maxsize=None)
def _detokenizer(lang: str) -> MosesDetokenizer:
    return MosesDetokenizer(lang)


def normalize_punctuation(line: str, lang: str) -> str:
    """``normalize-punctuation.perl -l LANG``: unify quotes, dashes and spacing."""
    return _normalizer(lang).normalize(line)


def tokenize(line: str, lang: str) -> str:
    """``tokenizer.perl -a -no-escape -l LANG``: space-separated tokens."""
    return _tokenizer(lang).tokenize(line, aggressive_dash_splits=True, escape=False,
                                     return_str=True)


def detokenize(line: str, lang: str) -> str:
    """``detokenizer.perl -l LANG``: join tokens back into running text."""
    return _detokenizer(lang).detokenize(line.split(), return_str=True, unescape=False)


def normalize_and_tokenize(line: str, lang: str, romanian: bool = False) -> str:
    """The WMT16 per-line chain; ``romanian`` adds the Romanian normalization steps."""
    line = normalize_punctuation(line, lang)
    if romanian:
        line = normalize_romanian_line(line)
    return tokenize(line, lang)


def tokenize_file(in_path: str, out_path: str, lang: str, romanian: bool = False,
                  workers: int = 1) -> int:
    """Normalize and tokenize every line of ``in_path``; return the number of lines."""
    fn = functools.partial(normalize_and_tokenize, lang=lang, romanian=romanian)
    return map_file(fn, in_path, out_path, workers, stage=f"tokenize {in_path}")


def detokenize_file(in_path: str, out_path: str, lang: str, workers: int = 1) -> int:
    """Detokenize every line of ``in_path``; return the number of lines."""
    return map_lines(functools.partial(detokenize, lang=lang), in_path, out_path, workers)
