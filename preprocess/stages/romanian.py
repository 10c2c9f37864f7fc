"""Romanian normalization of Sennrich et al.'s WMT16 pipeline (used by ConvS2S, section 4).

Ports of Barry Haddow's ``normalise-romanian.py`` and ``remove-diacritics.py`` from
github.com/rsennrich/wmt16-scripts (``preprocess/``), applied to the Romanian side after
punctuation normalization and before Moses tokenization. Both scripts are plain character
replacements; the maps below are theirs, character for character.
"""

# normalise-romanian.py: s and t with cedilla -> s and t with comma below.
_CEDILLA_TO_COMMA = str.maketrans({
    "\u015e": "\u0218",  # Ş -> Ș
    "\u015f": "\u0219",  # ş -> ș
    "\u0162": "\u021a",  # Ţ -> Ț
    "\u0163": "\u021b",  # ţ -> ț
})

# remove-diacritics.py (assumes the comma forms above): strip the Romanian diacritics.
_DIACRITICS = str.maketrans({
    "\u0218": "S", "\u0219": "s",  # Ș ș (comma below)
    "\u021a": "T", "\u021b": "t",  # Ț ț (comma below)
    "\u0102": "A", "\u0103": "a",  # Ă ă
    "\u00c2": "A", "\u00e2": "a",  # Â â
    "\u00ce": "I", "\u00ee": "i",  # Î î
})


def normalise_romanian(line: str) -> str:
    """Replace cedilla s/t (Ş ş Ţ ţ) by the comma-below forms (Ș ș Ț ț)."""
    return line.translate(_CEDILLA_TO_COMMA)


def remove_diacritics(line: str) -> str:
    """Replace ș ț ă â î (and capitals) by s t a a i; run :func:`normalise_romanian` first."""
    return line.translate(_DIACRITICS)


def normalize_romanian_line(line: str) -> str:
    """Both WMT16 steps in their order: comma forms first, then diacritic removal."""
    return remove_diacritics(normalise_romanian(line))
