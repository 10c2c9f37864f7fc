"""Training-corpus cleaning, like Moses ``clean-corpus-n.perl`` (paper section 4).

The paper removes training sentences longer than 175 words (WMT16 en-ro, WMT14 en-fr) and,
for en-fr, pairs whose length ratio exceeds 1.5. A pair is dropped when either side is
empty, either side has more than ``max_len`` tokens, or (unless ``ratio`` is None) one
side is more than ``ratio`` times as long as the other. Lengths are counted in
whitespace-separated tokens of the tokenized text. Valid and test sets are never cleaned.

In parallel, by chunks of :data:`CHUNK_LINES` pairs (:func:`..runtime.parallel.map_chunks_into`): each
worker reads its chunk of both files itself, decodes and judges the pairs, and writes the ones
it keeps to part files, which this process appends to the outputs in order.
"""
import functools
from typing import List, Optional

from ..errors import PreprocessError
from ..runtime.parallel import LineChunk, map_chunks_into, parallel_chunks, parts_folder, read_chunk
from ..runtime.progress import Progress
from ..textio import decode_line

DEFAULT_MAX_LEN = 175
DEFAULT_RATIO = 1.5
CHUNK_LINES = 100_000  # pairs handed to a worker at a time


def keep_pair(src: str, tgt: str, max_len: int = DEFAULT_MAX_LEN,
              ratio: Optional[float] = DEFAULT_RATIO) -> bool:
    """Whether a tokenized sentence pair passes the three cleaning rules."""
    src_len, tgt_len = len(src.split()), len(tgt.split())
    if src_len == 0 or tgt_len == 0:
        return False
    if src_len > max_len or tgt_len > max_len:
        return False
    return ratio is None or max(src_len / tgt_len, tgt_len / src_len) <= ratio


def _clean_chunk(src_in: str, tgt_in: str, max_len: int, ratio: Optional[float],
                 chunk: LineChunk, parts: List[str]) -> int:
    """Write the pairs of ``chunk`` that pass :func:`keep_pair` to its two part files;
    return how many."""
    kept = 0
    with open(parts[0], "w", encoding="utf-8", newline="\n") as src_part, \
            open(parts[1], "w", encoding="utf-8", newline="\n") as tgt_part:
        pairs = zip(read_chunk(src_in, chunk, 0), read_chunk(tgt_in, chunk, 1))
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
    total, chunks = parallel_chunks(src_in, tgt_in, CHUNK_LINES)
    kept = 0
    progress = Progress(f"clean {src_in} / {tgt_in}", total)
    clean_chunk = functools.partial(_clean_chunk, src_in, tgt_in, max_len, ratio)
    folder = parts_folder(src_out)
    with open(src_out, "wb") as src_f, open(tgt_out, "wb") as tgt_f:
        for chunk, chunk_kept in map_chunks_into(clean_chunk, chunks, [src_f, tgt_f], folder, workers):
            kept += chunk_kept
            progress.update(chunk.lines)
    progress.finish()
    if kept == 0:
        raise PreprocessError(
            f"cleaning dropped all {total} pairs of {src_in} / {tgt_in} "
            f"(max_len={max_len}, ratio={ratio}): check that the files are parallel, "
            "or loosen --max-len / --ratio."
        )
    return kept, total
