"""Moses punctuation normalization, tokenization and detokenization (sacremoses).

The paper (section 4) follows Sennrich et al.'s WMT16 preprocessing: per line,
``normalize-punctuation.perl -l LANG``, then for Romanian ``normalise-romanian.py`` and
``remove-diacritics.py``, then ``tokenizer.perl -a -l LANG`` (``-a``: aggressive hyphen
splitting, ``well-known`` -> ``well @-@ known``). Here those are sacremoses' ports;
special characters are not escaped (no ``&amp;``), so detokenization does not unescape.
"""
import functools
import re

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from .parallel import map_file
from .romanian import normalize_romanian_line
from .textio import map_lines


class CompiledPunctNormalizer(MosesPunctNormalizer):
    """sacremoses' punctuation normalizer with its patterns compiled once.

    Its ``normalize`` calls ``re.sub(pattern_string, ...)`` for each of about 45 patterns
    on every line, so that every call looks its pattern up in ``re``'s cache: a fifth of
    the time of normalizing and tokenizing a line (cProfile, 3000 lines of newstest2013).
    The same substitutions in the same order, each pattern compiled here, give the same
    text (``tests/test_preprocess.py`` compares them on real files).
    """

    def __init__(self, lang: str):
        super().__init__(lang)
        self.compiled = [(re.compile(pattern), substitution)
                         for pattern, substitution in self.substitutions]

    def normalize(self, text: str) -> str:
        if self.pre_replace_unicode_punct or self.post_remove_control_chars:
            return super().normalize(text)
        for pattern, substitution in self.compiled:
            text = pattern.sub(substitution, text)
        return text.strip()


class RequiredLiteral:
    """A compiled pattern every match of which contains ``literal``: text without it is
    returned as it is, without running the pattern (which gives that same text)."""

    def __init__(self, pattern: re.Pattern, literal: str):
        self.pattern, self.literal = pattern, literal

    def sub(self, substitution: str, text: str) -> str:
        return self.pattern.sub(substitution, text) if self.literal in text else text


# sacremoses' rules that cannot match without a literal character, told by the shape of
# their pattern: {attribute: (literal, what the pattern's text holds, at the top level)}.
_LITERAL_RULES = {
    "ENGLISH_SPECIFIC_APOSTROPHE": ("'", "])[']("), "FR_IT_SPECIFIC_APOSTROPHE": ("'", "])[']("),
    "NON_SPECIFIC_APOSTROPHE": ("'", "\\'"), "AGGRESSIVE_HYPHEN_SPLIT": ("-", "])\\-(?=["),
    "COMMA_SEPARATE_1": (",", "])[,]"), "COMMA_SEPARATE_2": (",", "[,]("),
    "COMMA_SEPARATE_3": (",", "])[,]$"),
}


class FasterMosesTokenizer(MosesTokenizer):
    """sacremoses' tokenizer, the same rules run less often.

    - The apostrophe, hyphen and comma rules (about half its time on English news: their
      character classes hold thousands of characters) run only on lines that hold an
      apostrophe, a hyphen or a comma; a rule is left as it is unless its pattern has the
      shape that makes the character part of every match (:data:`_LITERAL_RULES`).
    - ``islower`` and ``isanyalpha`` (asked of a token before a full stop) build a set of
      the thousands of characters of ``IsLower`` or ``IsAlpha`` on every call, about
      0.3 ms each; here each set is built once.

    ``tests/test_preprocess.py`` compares its output with sacremoses' on real files.
    """

    def __init__(self, lang: str):
        super().__init__(lang)
        for name, (literal, shape) in _LITERAL_RULES.items():
            rules = getattr(self, name)
            guarded = [(RequiredLiteral(pattern, literal), substitution)
                       if pattern.pattern.count(shape) == 1 else (pattern, substitution)
                       for pattern, substitution in (rules if isinstance(rules, list) else [rules])]
            setattr(self, name, guarded if isinstance(rules, list) else guarded[0])

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
    return CompiledPunctNormalizer(lang)


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
