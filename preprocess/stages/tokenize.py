"""Moses punctuation normalization, tokenization and detokenization (sacremoses).

The paper (section 4) follows Sennrich et al.'s WMT16 preprocessing: per line,
``normalize-punctuation.perl -l LANG``, then for Romanian ``normalise-romanian.py`` and
``remove-diacritics.py``, then ``tokenizer.perl -a -l LANG`` (``-a``: aggressive hyphen
splitting, ``well-known`` -> ``well @-@ known``). Here those are sacremoses' ports;
special characters are not escaped (no ``&amp;``), so detokenization does not unescape.

Tokenizing is the longest stage of preparing a WMT corpus, so sacremoses' classes run here
through subclasses that give the same text about 6 times faster than before issue 35 and 4
times faster than Moses' perl scripts (210,018 lines of English, newstest2013-14 and
Multi30k's training set 6 times, in one process: 14.2 CPU-s before, 2.4 after, perl 9.9;
German 16.1, 3.3 and 10.3; French 20.8, 3.4 and 12.5; best of 3 on an AMD EPYC shared with
other work), and a file's lines go to every core in batches (:mod:`..runtime.parallel`).
"""
import functools
import logging
import re

try:  # the parser that re.compile uses
    from re import _constants, _parser
except ImportError:  # Python < 3.11
    import sre_constants as _constants
    import sre_parse as _parser
from typing import Iterator, Optional, Tuple

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from ..runtime.parallel import map_file
from .romanian import normalize_romanian_line
from ..textio import scrub, scrubbed

logger = logging.getLogger(__name__)


def _parse(pattern: str, flags: int):
    """``pattern``'s parsed items, or None where they may match case-insensitively."""
    if flags & re.IGNORECASE:
        return None
    try:
        parsed = _parser.parse(pattern, flags)
    except (re.error, RecursionError):
        return None
    return None if parsed.state.flags & re.IGNORECASE else parsed


def required_literal(pattern: str, flags: int = 0) -> Optional[str]:
    """A character that every match of ``pattern`` contains, or None if none is evident:
    a literal (or a class of one character) among the pattern's top-level elements or a
    group's, not under a repeat, an alternative or a look-around."""
    parsed = _parse(pattern, flags)
    if parsed is None:
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


def required_text(pattern: str, flags: int = 0) -> str:
    """The longest text that every match of ``pattern`` contains, "" if none is evident:
    consecutive literals (or classes of one character, or ``c{m,n}``'s first m) among the
    pattern's top-level elements and its groups', with nothing between them (an anchor, a
    look-around, another repeat, an alternative or a class ends a run)."""
    parsed = _parse(pattern, flags)
    if parsed is None:
        return ""

    def runs(items, current: list) -> Iterator[str]:
        for op, value in items:
            if op is _constants.LITERAL:
                current.append(chr(value))
            elif op is _constants.IN and len(value) == 1 and value[0][0] is _constants.LITERAL:
                current.append(chr(value[0][1]))
            elif op is _constants.SUBPATTERN and not value[1] & re.IGNORECASE:
                yield from runs(value[-1], current)  # a group: its items, in their place
            elif op in (_constants.MAX_REPEAT, _constants.MIN_REPEAT) and value[0] \
                    and len(value[2]) == 1 and value[2][0][0] is _constants.LITERAL:
                # c{m,n}: m times c; the run goes on after it only if n is m
                current += chr(value[2][0][1]) * value[0]
                if value[1] != value[0]:
                    yield "".join(current)
                    current[:] = chr(value[2][0][1]) * value[0]
            else:
                yield "".join(current)
                current.clear()
        yield "".join(current)  # where the items end (a run may go on after a group)
    return max(runs(parsed, []), key=len)


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


def _rule(pattern, substitution: str) -> Tuple[str, re.Pattern, str]:
    """``(needed, compiled, substitution)``: a substitution rule with the text all its
    matches contain, to skip it on a line without that text (``"" in line`` is true)."""
    if pattern == " +" and substitution == " ":
        # A single space is left as it was: the rule does something only where two are
        # (2.7 us a line of English for each of the normalizer's 4 such rules, 0.1 here).
        pattern = " {2,}"
    pattern = re.compile(pattern)
    return required_text(pattern.pattern, pattern.flags), pattern, substitution


class FasterPunctNormalizer(MosesPunctNormalizer):
    """sacremoses' punctuation normalizer, the same substitutions in the same order, faster.

    Its ``normalize`` calls ``re.sub(pattern_string, ...)`` for each of about 45 patterns on
    every line, and most patterns need a character the line does not hold (a curly quote,
    a non-breaking space). Here, each pattern compiled once (``re.sub``'s look-up in
    ``re``'s cache was a fifth of the time of normalizing and tokenizing a line):

    - a rule is skipped on a line without the text all its matches contain
      (:func:`required_text`: ``" %"`` for ``(\\d) %``, not just ``" "``), tested in a loop
      that makes no call (a method call per rule cost 0.3 us, 45 a line);
    - on an ASCII line, only the rules that can match ASCII text are looked at: none of the
      rules gives a character that is not ASCII where it found ASCII text.

    Per line of English (CPU time, best of 3, 40,000 lines of news and Multi30k): 21 us
    before, 2.2 here (German: 24 and 4.4, French: 25 and 5.8).
    """

    def __init__(self, lang: str):
        super().__init__(lang)
        self.rules = [_rule(pattern, substitution) for pattern, substitution in self.substitutions]
        ascii_out = all(sub.isascii() for needed, _, sub in self.rules if needed.isascii())
        self.ascii_rules = [rule for rule in self.rules if rule[0].isascii()] if ascii_out \
            else self.rules

    def normalize(self, text: str) -> str:
        if self.pre_replace_unicode_punct or self.post_remove_control_chars:
            return super().normalize(text)
        for needed, pattern, substitution in self.ascii_rules if text.isascii() else self.rules:
            if needed in text:
                text = pattern.sub(substitution, text)
        return text.strip()


def _is_rule(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], re.Pattern)


class FasterMosesTokenizer(MosesTokenizer):
    """sacremoses' tokenizer, the same rules, run less often and with less Python.

    ``tokenize(line, aggressive_dash_splits=True, escape=False)`` (``tokenizer.perl -a
    -no-escape``, the only call made here) runs :meth:`moses`, a copy of sacremoses' steps
    in which each step gives the text sacremoses' step gives (``tests/test_tokenize.py``
    compares the two on real and on random text); any other call runs sacremoses' own.
    Per line of English (CPU time, best of 3, 40,000 lines of news and Multi30k; before:
    41 us, here 6):

    - Spaces: ``" ".join(text.split())`` where the text has "  " or a space other than " "
      (``\\s+`` on every line: 3.9 us, here 0.6).
    - A rule is skipped on a line without a character all its matches need (a comma, an
      apostrophe, a hyphen, ``..``, ``MULTI``).
    - Python 3.11's ``re`` expands a substitution with a group (``\\1 , ``) by calling
      Python (``re._subx``, then a function per match), about 1 us a rule and a match:
      a rule whose group puts back the one character it matched is written here with
      look-arounds and a plain substitution, where that gives the same text (see
      :meth:`moses`); padding with spaces is ``" ".join(pattern.split(text))``
      (``PAD_NOT_ISALNUM``: 3.9 us, here 0.6).
    - Each look-around pattern starts with its punctuation mark, so that ``re`` scans for
      that character and tests the classes only there (a class of ``IsAlpha`` holds 32
      letters beyond the BMP, tested one by one for each character that is not a letter):
      hyphens, dots, commas and apostrophes took 43 us in sacremoses, 1.2 here.
    - Nonbreaking prefixes: see :meth:`split_full_stops` (17 us, here 2.4).
    - ``islower`` and ``isanyalpha`` build a set of the thousands of characters of
      ``IsLower`` or ``IsAlpha`` on every call, about 0.3 ms each; here each set is built once.
    """

    def __init__(self, lang: str):
        super().__init__(lang)
        # moses' patterns, from the character sets of sacremoses' rules: the instance's
        # IsAlnum (with CJK letters for zh, ja and ko) as PAD_NOT_ISALNUM and
        # AGGRESSIVE_HYPHEN_SPLIT, the class's IsAlpha and IsN as the comma and apostrophe rules.
        alnum, alpha, digits = self.IsAlnum, MosesTokenizer.IsAlpha, MosesTokenizer.IsN
        # PAD_NOT_ISALNUM's class, with " " (in \s already) put where ``re`` finds it at
        # once, not after the letters beyond the BMP (1.45 us a line of English, 0.63).
        self.pad_not_alnum = re.compile(r"([^ {}\s\.'\`\,\-])".format(alnum))
        # Look-arounds, each after its punctuation mark (see the class's documentation).
        self.hyphen = re.compile(r"\-(?<=[{0}]\-)(?=[{0}])".format(alnum))
        self.commas = [(re.compile(r",(?<=[^{}],)".format(digits)), " , "),
                       (re.compile(r",(?=[^{}])".format(digits)), " , "),
                       (re.compile(r",(?<=[{}],)$".format(digits)), " , ")]
        if lang == "en":
            self.apostrophes = [
                (re.compile(r"'(?<=[^{0}]')(?=[^{0}])".format(alpha)), " ' "),
                (re.compile(r"'(?<=[^{0}{1}]')(?=[{0}])".format(alpha, digits)), " ' "),
                (re.compile(r"'(?<=[{0}]')(?=[^{0}])".format(alpha)), " ' "),
                (re.compile(r"'(?<=[{0}]')(?=[{0}])".format(alpha)), " '"),
                (re.compile(r"'(?<=[{0}]')(?=[s])".format(digits)), " '")]
        elif lang in ("fr", "it"):
            self.apostrophes = [
                (re.compile(r"'(?<=[^{0}]')(?=[^{0}])".format(alpha)), " ' "),
                (re.compile(r"'(?<=[^{0}]')(?=[{0}])".format(alpha)), " ' "),
                (re.compile(r"'(?<=[{0}]')(?=[^{0}])".format(alpha)), " ' "),
                (re.compile(r"'(?<=[{0}]')(?=[{0}])".format(alpha)), "' ")]
        self.numeric_only = frozenset(self.NUMERIC_ONLY_PREFIXES)
        self.nonbreaking = frozenset(self.NONBREAKING_PREFIXES) - self.numeric_only
        self.rules_guarded = False

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

    def guard_rules(self) -> None:
        """Has sacremoses' own steps (calls other than :meth:`moses`) skip each rule on a
        line without a character all its matches need (:func:`guarded`). Done at the first
        such call: parsing the patterns again takes 0.3 s."""
        if self.rules_guarded:
            return
        for name in dir(self):
            value = getattr(self, name) if name.isupper() else None
            if _is_rule(value):
                setattr(self, name, (guarded(value[0]), value[1]))
            elif isinstance(value, list) and value and all(map(_is_rule, value)):
                setattr(self, name, [(guarded(pattern), sub) for pattern, sub in value])
        self.rules_guarded = True

    def tokenize(self, text, aggressive_dash_splits=False, return_str=False, escape=True,
                 protected_patterns=None):
        if not aggressive_dash_splits or escape or protected_patterns:
            self.guard_rules()
            return super().tokenize(text, aggressive_dash_splits, return_str, escape,
                                    protected_patterns)
        text = self.moses(str(text))
        return text if return_str else text.split()

    #: Two apostrophes at most 2 characters apart.
    CLOSE_APOSTROPHES = re.compile(r"'.?'", re.DOTALL)

    def moses(self, text: str) -> str:
        """sacremoses' ``tokenize(text, aggressive_dash_splits=True, escape=False)``.

        Where sacremoses' rule ``([^N])[,]`` -> ``\\1 , `` takes the character before a
        comma, ``,(?<=[^N],)`` -> `` , `` only looks at it: the same matches, unless that
        character is a comma another match took (``,,``), so the look-around rules run
        only on lines without ``,,``; likewise for apostrophes 3 or more characters apart,
        and always for hyphens (the character a match takes is never a hyphen).
        """
        # \s+ -> " ", control characters removed, strip. A printable text holds neither a
        # control character nor a space other than " " (``str.isprintable``; checked for
        # every character in the tests), so it needs no more than collapsing "  ".
        if not text.isprintable():
            text = self.ASCII_JUNK[0].sub("", " ".join(text.split())).strip()
        elif "  " in text or text[:1] == " " or text[-1:] == " ":
            text = " ".join(text.split())
        text = " ".join(self.pad_not_alnum.split(text))  # PAD_NOT_ISALNUM: " \1 "
        if "-" in text:
            text = self.hyphen.sub(" @-@ ", text)
        if ".." in text:
            text = self.replace_multidots(text)
        if "," in text:
            for pattern, substitution in self.commas if ",," not in text else (
                    self.COMMA_SEPARATE_1, self.COMMA_SEPARATE_2, self.COMMA_SEPARATE_3):
                text = pattern.sub(substitution, text)
        if "'" in text:
            if self.lang not in ("en", "fr", "it"):
                text = text.replace("'", " ' ")  # NON_SPECIFIC_APOSTROPHE
            else:
                for pattern, substitution in self.apostrophes \
                        if not self.CLOSE_APOSTROPHES.search(text) \
                        else self.ENGLISH_SPECIFIC_APOSTROPHE if self.lang == "en" \
                        else self.FR_IT_SPECIFIC_APOSTROPHE:
                    text = pattern.sub(substitution, text)
        # sacremoses collapses spaces after the nonbreaking prefixes, where it changes
        # nothing (they join tokens with one space); before them, it lets them look for " ".
        text = " ".join(text.split())
        if "." in text:
            text = self.split_full_stops(text)
        if ".'" in text:
            text = self.TRAILING_DOT_APOSTROPHE[0].sub(self.TRAILING_DOT_APOSTROPHE[1], text)
        if "MULTI" in text:
            text = self.restore_multidots(text)
        return text

    def split_full_stops(self, text: str) -> str:
        """sacremoses' ``handles_nonbreaking_prefixes`` for ``text`` with single spaces,
        stripped: the tokens that end with a full stop are found with ``str.find`` and
        looked at, no others (sacremoses runs ``re.search`` on every token, in Python)."""
        pieces, done, end = [], 0, len(text)
        stop = text.find(".")
        while stop != -1:
            after = stop + 1
            if after == end or text[after] == " ":  # the end of a token
                start = text.rfind(" ", 0, stop) + 1
                if start < stop and not self.keeps_full_stop(
                        text[start:stop], text[after + 1] if after < end else None):
                    pieces += text[done:stop], " ."
                    done = after
            stop = text.find(".", after)
        return "".join(pieces) + text[done:] if pieces else text

    def keeps_full_stop(self, prefix: str, following: Optional[str]) -> bool:
        """Whether the token ``prefix + "."`` keeps its full stop, ``following`` the first
        character of the next token (None at the end): sacremoses' conditions."""
        return prefix in self.nonbreaking or following is not None and (
            following in self.lower_characters
            or prefix in self.numeric_only and following in "0123456789") \
            or "." in prefix and self.isanyalpha(prefix)


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
    """The WMT16 per-line chain, after :func:`..textio.scrub` (control characters become spaces,
    a leading byte-order mark goes); ``romanian`` adds the Romanian normalization steps."""
    line = normalize_punctuation(scrub(line), lang)
    if romanian:
        line = normalize_romanian_line(line)
    return tokenize(line, lang)


def tokenize_file(in_path: str, out_path: str, lang: str, romanian: bool = False,
                  workers: int = 1) -> int:
    """Normalize and tokenize every line of ``in_path``; return the number of lines. Logs how
    many control characters became spaces and byte-order marks were removed."""
    fn = functools.partial(normalize_and_tokenize, lang=lang, romanian=romanian)
    lines = map_file(fn, in_path, out_path, workers, stage=f"tokenize {in_path}")
    found = scrubbed(in_path)
    if found.controls or found.marks:
        logger.warning(f"tokenize {in_path}: {found.controls} control characters (NUL, ...) became spaces, "
                       f"{found.marks} byte-order marks at the start of a line were removed (the first: line "
                       f"{found.first_line})")
    return lines


def detokenize_file(in_path: str, out_path: str, lang: str, workers: int = 1) -> int:
    """Detokenize every line of ``in_path``; return the number of lines."""
    return map_file(functools.partial(detokenize, lang=lang), in_path, out_path, workers,
                    stage=f"detokenize {in_path}")
