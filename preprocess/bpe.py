"""Joint byte-pair encoding with subword-nmt (Sennrich et al., 2016).

The paper uses a joint source/target BPE vocabulary of 40K merge operations (section 4):
codes are learned on the concatenation of both tokenized training sides, as in Sennrich's
WMT16 ``preprocess.sh`` (``cat train.SRC train.TGT | learn_bpe.py -s N``), and applied to
every file with the ``@@ `` continuation marker. :func:`remove_bpe` undoes it on output,
like ``sed -r 's/(@@ )|(@@ ?$)//g'``.
"""
import contextlib
import functools
import io
import itertools
import re
import sys
from typing import Sequence

from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

from .textio import map_lines, read_lines

DEFAULT_MERGES = 40000
SEPARATOR = "@@"
_BPE_MARKER = re.compile(r"(@@ )|(@@ ?$)")


def learn_joint_bpe(train_paths: Sequence[str], codes_path: str,
                    merges: int = DEFAULT_MERGES) -> None:
    """Learn ``merges`` BPE operations on the concatenation of ``train_paths``.

    subword-nmt draws a tqdm progress bar on stderr; written to a log file, its carriage
    returns make one unreadable line of thousands of updates, so it is drawn on a terminal
    only (the pipeline logs the step itself)."""
    lines = itertools.chain.from_iterable(read_lines(path) for path in train_paths)
    bar = contextlib.nullcontext() if sys.stderr.isatty() else contextlib.redirect_stderr(io.StringIO())
    with open(codes_path, "w", encoding="utf-8") as codes, bar:
        learn_bpe(lines, codes, merges)


@functools.lru_cache(maxsize=None)
def _load_codes(codes_path: str) -> BPE:
    with open(codes_path, encoding="utf-8") as codes:
        return BPE(codes, separator=SEPARATOR)


def apply_bpe(line: str, codes_path: str) -> str:
    """Segment one tokenized line with the codes in ``codes_path``."""
    return _load_codes(codes_path).segment(line)


def apply_bpe_file(codes_path: str, in_path: str, out_path: str, workers: int = 1) -> int:
    """Segment every line of ``in_path``; return the number of lines."""
    _load_codes.cache_clear()  # codes_path may have been learned again since it was read
    fn = functools.partial(apply_bpe, codes_path=codes_path)
    return map_lines(fn, in_path, out_path, workers)


def remove_bpe(line: str) -> str:
    """Join subword units back into words: ``sed -r 's/(@@ )|(@@ ?$)//g'``."""
    return _BPE_MARKER.sub("", line)


def remove_bpe_file(in_path: str, out_path: str) -> int:
    """:func:`remove_bpe` on every line of ``in_path``; return the number of lines."""
    return map_lines(remove_bpe, in_path, out_path)
