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
from collections import Counter
from typing import Sequence

from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

from .parallel import batched, map_batches, map_file
from .progress import CountingWriter, Progress
from .textio import count_lines, map_lines, read_lines, spread_evenly

DEFAULT_MERGES = 40000
# convs2s-prepare learns the codes from at most this many pairs of a larger corpus
# (--bpe-sample), chosen by bench/sampling.py: see the performance page.
DEFAULT_SAMPLE = 0
SEPARATOR = "@@"
_BPE_MARKER = re.compile(r"(@@ )|(@@ ?$)")
# Lines per batch of word counting: its result, a Counter, is sent back whole.
COUNT_BATCH_LINES = 50000


def _count_words(lines: list) -> tuple:
    """(number of lines, word counts of the lines), split as subword-nmt's
    ``get_vocabulary`` splits them, in order of first occurrence."""
    counts = Counter()
    for line in lines:
        for word in line.strip("\r\n ").split(" "):
            if word:
                counts[word] += 1
    return len(lines), counts


def sampled_lines(paths: Sequence[str], sample: int = 0) -> tuple:
    """(number of lines, lines) of the concatenation of ``paths``, ``sample`` lines of each
    spread evenly (the same pairs of parallel files); 0: every line."""
    totals = [count_lines(path) for path in paths]
    kept = [min(sample, total) if sample else total for total in totals]
    return sum(kept), itertools.chain.from_iterable(
        spread_evenly(read_lines(path), size, total) for path, size, total in zip(paths, kept, totals))


def count_words(paths: Sequence[str], workers: int = 1, sample: int = 0) -> Counter:
    """Word counts of :func:`sampled_lines` in ``workers`` processes, each word first where
    it first occurs, as subword-nmt counts: its codes depend on that order (words of equal
    counts keep it when sorted)."""
    total, lines = sampled_lines(paths, sample)
    progress = Progress("count words for BPE", total, unit="lines")
    counts = Counter()
    for batch, batch_counts in map_batches(_count_words, batched(lines, COUNT_BATCH_LINES), workers):
        counts.update(batch_counts)
        progress.update(batch)
    progress.finish()
    return counts


def learn_joint_bpe(train_paths: Sequence[str], codes_path: str,
                    merges: int = DEFAULT_MERGES, workers: int = 1, sample: int = 0) -> None:
    """Learn ``merges`` BPE operations on the concatenation of ``train_paths``.

    The words are counted in ``workers`` processes and handed to subword-nmt as its
    word-frequency dictionary; the merges themselves are learned on one core, as subword-nmt
    learns them, and the codes are the same as from the text itself. ``sample``: learn from
    this many lines of each file, spread evenly (0: all). The merge loop's time grows with
    the number of distinct words, which a sample bounds; what it changes in the segmented
    text is measured by ``python -m bench.sampling`` (the performance page). subword-nmt
    draws a tqdm bar on stderr, whose carriage returns make one unreadable line of a log
    file: it is drawn on a terminal only, and the merges written are logged as progress instead.
    """
    counts = count_words(train_paths, workers, sample)
    if any(word[0] == "\r" for word in counts):  # a dictionary line cannot start with it
        vocabulary, is_dict = sampled_lines(train_paths, sample)[1], False
    else:
        vocabulary, is_dict = (f"{word} {count}" for word, count in counts.items()), True
    progress = Progress("learn BPE", merges, unit="merges")
    bar = contextlib.nullcontext() if sys.stderr.isatty() else contextlib.redirect_stderr(io.StringIO())
    with open(codes_path, "w", encoding="utf-8") as codes, bar:
        learn_bpe(vocabulary, CountingWriter(codes, progress, header_lines=1), merges, is_dict=is_dict)
    progress.finish()


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
    return map_file(fn, in_path, out_path, workers, stage=f"apply BPE to {in_path}")


def remove_bpe(line: str) -> str:
    """Join subword units back into words: ``sed -r 's/(@@ )|(@@ ?$)//g'``."""
    return _BPE_MARKER.sub("", line)


def remove_bpe_file(in_path: str, out_path: str) -> int:
    """:func:`remove_bpe` on every line of ``in_path``; return the number of lines."""
    return map_lines(remove_bpe, in_path, out_path)
