"""Moses punctuation normalization, tokenization and detokenization (sacremoses).

The paper (section 4) follows Sennrich et al.'s WMT16 preprocessing: per line,
``normalize-punctuation.perl -l LANG``, then for Romanian ``normalise-romanian.py`` and
``remove-diacritics.py``, then ``tokenizer.perl -a -l LANG`` (``-a``: aggressive hyphen
splitting, ``well-known`` -> ``well @-@ known``). Here those are sacremoses' ports;
special characters are not escaped (no ``&amp;``), so detokenization does not unescape.
"""
import functools

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from .romanian import normalize_romanian_line
from .textio import map_lines


@functools.lru_cache(maxsize=None)
def _normalizer(lang: str) -> MosesPunctNormalizer:
    return MosesPunctNormalizer(lang)


@functools.lru_cache(maxsize=None)
def _tokenizer(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang)


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
    return map_lines(fn, in_path, out_path, workers)


def detokenize_file(in_path: str, out_path: str, lang: str, workers: int = 1) -> int:
    """Detokenize every line of ``in_path``; return the number of lines."""
    return map_lines(functools.partial(detokenize, lang=lang), in_path, out_path, workers)
