"""Training-corpus cleaning, like Moses ``clean-corpus-n.perl`` (paper section 4).

The paper removes training sentences longer than 175 words (WMT16 en-ro, WMT14 en-fr) and,
for en-fr, pairs whose length ratio exceeds 1.5. A pair is dropped when either side is
empty, either side has more than ``max_len`` tokens, or (unless ``ratio`` is None) one
side is more than ``ratio`` times as long as the other. Lengths are counted in
whitespace-separated tokens of the tokenized text. Valid and test sets are never cleaned.

In parallel: one fast scan of each file (``bytes.count`` of newlines, block by block) finds
the byte offset of every :data:`CHUNK_LINES`-th line. Each chunk of pairs goes to a worker
process (:func:`.parallel.map_batches`), which reads its lines from both files itself,
decodes and judges them, and writes the pairs it keeps to part files in a hidden folder
beside ``src_out``; this process appends the parts to the outputs in order and deletes
them. It never handles a line itself, and a worker holds one line of each side at a time.
"""
import contextlib
import functools
import itertools
import os
import shutil
from typing import List, NamedTuple, Optional, Tuple

from .errors import PreprocessError
from .parallel import map_batches
from .progress import Progress
from .textio import check_parallel, decode_line

DEFAULT_MAX_LEN = 175
DEFAULT_RATIO = 1.5
CHUNK_LINES = 100_000  # pairs handed to a worker at a time
SCAN_BYTES = 1 << 20  # read at a time when scanning a file for its chunks' offsets


def keep_pair(src: str, tgt: str, max_len: int = DEFAULT_MAX_LEN,
              ratio: Optional[float] = DEFAULT_RATIO) -> bool:
    """Whether a tokenized sentence pair passes the three cleaning rules."""
    src_len, tgt_len = len(src.split()), len(tgt.split())
    if src_len == 0 or tgt_len == 0:
        return False
    if src_len > max_len or tgt_len > max_len:
        return False
    return ratio is None or max(src_len / tgt_len, tgt_len / src_len) <= ratio


class _Chunk(NamedTuple):
    index: int
    first: int  # number of its first line in the files, from 1
    lines: int
    src_start: int  # byte offsets of its first line
    tgt_start: int


def _chunk_starts(path: str, chunk_lines: int) -> Tuple[int, List[int]]:
    """(lines, starts): the number of lines of ``path`` (a last one without a newline
    counts, as in :func:`.textio.count_lines`) and the byte offsets where its lines 0,
    ``chunk_lines``, 2 * ``chunk_lines``... begin (the last may be the file's end, where no
    line begins). Only ``b"\\n"`` ends a line, as in :func:`.textio.read_lines`."""
    starts, newlines, offset, last = [], 0, 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            count = block.count(b"\n")
            # line L begins after the file's L-th newline: the n-th of this block
            while (n := len(starts) * chunk_lines - newlines) <= count:
                starts.append(offset + len(block) - len(block.split(b"\n", n)[n]))
            newlines, offset, last = newlines + count, offset + len(block), block[-1:]
    return newlines + (last != b"\n"), starts


def _part(folder: str, index: int, side: str) -> str:
    return os.path.join(folder, f"{index:06d}.{side}")


def _clean_chunk(src_in: str, tgt_in: str, folder: str, max_len: int,
                 ratio: Optional[float], chunk: _Chunk) -> int:
    """Write the pairs of ``chunk`` that pass :func:`keep_pair` to its part files; return
    how many."""
    kept, parts = 0, [_part(folder, chunk.index, side) for side in ("src", "tgt")]
    with open(src_in, "rb") as src_f, open(tgt_in, "rb") as tgt_f, \
            open(parts[0], "w", encoding="utf-8", newline="\n") as src_part, \
            open(parts[1], "w", encoding="utf-8", newline="\n") as tgt_part:
        src_f.seek(chunk.src_start)
        tgt_f.seek(chunk.tgt_start)
        pairs = itertools.islice(zip(src_f, tgt_f), chunk.lines)
        for number, (src_raw, tgt_raw) in enumerate(pairs, chunk.first):
            src, tgt = decode_line(src_raw, src_in, number), decode_line(tgt_raw, tgt_in, number)
            if keep_pair(src, tgt, max_len, ratio):
                src_part.write(src + "\n")
                tgt_part.write(tgt + "\n")
                kept += 1
    return kept


def clean_corpus(src_in: str, tgt_in: str, src_out: str, tgt_out: str,
                 max_len: int = DEFAULT_MAX_LEN, ratio: Optional[float] = DEFAULT_RATIO,
                 workers: int = 1) -> tuple:
    """Copy the pairs that pass :func:`keep_pair`, judged by ``workers`` processes; return
    (pairs kept, pairs read)."""
    total, src_starts = _chunk_starts(src_in, CHUNK_LINES)
    tgt_total, tgt_starts = _chunk_starts(tgt_in, CHUNK_LINES)
    if tgt_total != total:
        check_parallel(src_in, tgt_in)  # fails, naming both counts
        raise PreprocessError(f"{src_in} or {tgt_in} changed while it was read: "
                              "make sure nothing writes them, and run the command again")
    chunks = []
    for index, first in enumerate(range(0, total, CHUNK_LINES)):
        chunks.append(_Chunk(index, first + 1, min(CHUNK_LINES, total - first),
                             src_starts[index], tgt_starts[index]))
    directory, name = os.path.split(os.path.abspath(src_out))
    folder = os.path.join(directory, f".{name}.clean-parts")
    shutil.rmtree(folder, ignore_errors=True)  # left by a killed run
    os.makedirs(folder)
    kept = 0
    progress = Progress(f"clean {src_in} / {tgt_in}", total)
    clean_chunk = functools.partial(_clean_chunk, src_in, tgt_in, folder, max_len, ratio)
    results = map_batches(clean_chunk, chunks, min(workers, len(chunks)))
    try:
        with open(src_out, "wb") as src_f, open(tgt_out, "wb") as tgt_f, \
                contextlib.closing(results):
            for chunk, chunk_kept in zip(chunks, results):
                for side, out in (("src", src_f), ("tgt", tgt_f)):
                    path = _part(folder, chunk.index, side)
                    with open(path, "rb") as part:
                        shutil.copyfileobj(part, out, 1 << 20)
                    os.remove(path)
                kept += chunk_kept
                progress.update(chunk.lines)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    progress.finish()
    if kept == 0:
        raise PreprocessError(
            f"cleaning dropped all {total} pairs of {src_in} / {tgt_in} "
            f"(max_len={max_len}, ratio={ratio}): check that the files are parallel, "
            "or loosen --max-len / --ratio."
        )
    return kept, total
