"""Training-corpus cleaning, like Moses ``clean-corpus-n.perl`` (paper section 4).

The paper removes training sentences longer than 175 words (WMT16 en-ro, WMT14 en-fr) and,
for en-fr, pairs whose length ratio exceeds 1.5. A pair is dropped when either side is
empty, either side has more than ``max_len`` tokens, or (unless ``ratio`` is None) one
side is more than ``ratio`` times as long as the other. Lengths are counted in
whitespace-separated tokens of the tokenized text. Valid and test sets are never cleaned.
"""
from typing import Optional

from .errors import PreprocessError
from .progress import Progress
from .textio import check_parallel, read_lines

DEFAULT_MAX_LEN = 175
DEFAULT_RATIO = 1.5
PROGRESS_PAIRS = 10000  # pairs counted at a time as progress


def keep_pair(src: str, tgt: str, max_len: int = DEFAULT_MAX_LEN,
              ratio: Optional[float] = DEFAULT_RATIO) -> bool:
    """Whether a tokenized sentence pair passes the three cleaning rules."""
    src_len, tgt_len = len(src.split()), len(tgt.split())
    if src_len == 0 or tgt_len == 0:
        return False
    if src_len > max_len or tgt_len > max_len:
        return False
    return ratio is None or max(src_len / tgt_len, tgt_len / src_len) <= ratio


def clean_corpus(src_in: str, tgt_in: str, src_out: str, tgt_out: str,
                 max_len: int = DEFAULT_MAX_LEN, ratio: Optional[float] = DEFAULT_RATIO
                 ) -> tuple:
    """Copy the pairs that pass :func:`keep_pair`; return (pairs kept, pairs read)."""
    total = check_parallel(src_in, tgt_in)
    kept = 0
    progress = Progress(f"clean {src_in} / {tgt_in}", total)
    with open(src_out, "w", encoding="utf-8") as src_f, \
            open(tgt_out, "w", encoding="utf-8") as tgt_f:
        for number, (src, tgt) in enumerate(zip(read_lines(src_in), read_lines(tgt_in)), 1):
            if keep_pair(src, tgt, max_len, ratio):
                src_f.write(src + "\n")
                tgt_f.write(tgt + "\n")
                kept += 1
            if number % PROGRESS_PAIRS == 0:
                progress.update(PROGRESS_PAIRS)
    progress.update(total - progress.done)
    progress.finish()
    if kept == 0:
        raise PreprocessError(
            f"cleaning dropped all {total} pairs of {src_in} / {tgt_in} "
            f"(max_len={max_len}, ratio={ratio}): check that the files are parallel, "
            "or loosen --max-len / --ratio."
        )
    return kept, total
