"""UTF-8 line I/O for parallel corpora, with errors that name the file and the line.

Every step of the pipeline reads and writes one sentence per line, line N of one language
aligned with line N of the other (the layout of the WMT data, Sennrich's WMT16 scripts and
``fairseq-preprocess``).
"""
import os
from typing import Callable, Iterable, Iterator

from .errors import PreprocessError
from .processes import worker_pool

# Lines handed to a worker process at a time when a file is mapped in parallel.
CHUNK_LINES = 2000


def read_lines(path: str) -> Iterator[str]:
    """Yield the lines of a UTF-8 file without their line ending.

    The file is decoded line by line, so a byte sequence that is not UTF-8 is reported
    with its line number instead of a bare ``UnicodeDecodeError``.
    """
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            yield decode_line(raw, path, number)


def decode_line(raw: bytes, path: str, number: int) -> str:
    """Line ``number`` of ``path``, read as bytes, decoded and without its line ending; a
    line that is not UTF-8 is an error naming the file, the line and the fix."""
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise PreprocessError(
            f"{path}, line {number}: not valid UTF-8 ({exc.reason} at byte {exc.start}: "
            f"{raw[exc.start:exc.start + 4]!r}). Fix: convert the file to UTF-8, e.g. "
            f"`iconv -f ISO-8859-1 -t UTF-8 {path} > {path}.utf8` (use the file's real "
            "encoding), or remove that line from both sides of the corpus."
        ) from None


def write_lines(path: str, lines: Iterable[str]) -> int:
    """Write one line per item (UTF-8, ``\\n`` endings) and return how many were written."""
    count = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
            count += 1
    return count


def spread_evenly(items: Iterable, size: int, total: int) -> Iterator:
    """``size`` of the ``total`` items, spread evenly: item i (from 0) is kept where
    ``i * size // total`` steps up. The same lines of both sides of a corpus, and every part
    of a corpus made of several sources one after the other; all items if size >= total."""
    for i, item in enumerate(items):
        if in_sample(i, size, total):
            yield item


def in_sample(i: int, size: int, total: int) -> bool:
    """Whether :func:`spread_evenly` keeps item ``i`` (from 0) of ``total``."""
    return size >= total or (i + 1) * size // total > i * size // total


def sample_option(name: str, sample: int, path: str) -> dict:
    """``{name: sample}`` where a sample of ``sample`` lines leaves some of ``path``'s out, else
    ``{}``: for a step's record, so that a sample no smaller than the corpus (which is the
    corpus) leaves the step current. A missing ``path`` gives ``{}`` (the step names it)."""
    return {name: sample} if 0 < sample and os.path.isfile(path) and sample < count_lines(path) else {}


def count_lines(path: str) -> int:
    """Number of lines, counting a last line without a newline, as :func:`read_lines` does."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def check_parallel(src_path: str, tgt_path: str) -> int:
    """Return the number of sentence pairs, or fail if the two sides differ in length."""
    src_count, tgt_count = count_lines(src_path), count_lines(tgt_path)
    if src_count != tgt_count:
        raise PreprocessError(
            f"parallel files differ in length: {src_path} has {src_count} lines, "
            f"{tgt_path} has {tgt_count} lines. Line N of one side must translate line N of "
            "the other: fix or re-extract the corpus."
        )
    return src_count


def map_lines(fn: Callable[[str], str], in_path: str, out_path: str, workers: int = 1) -> int:
    """Write ``fn(line)`` for every line of ``in_path`` to ``out_path``, in order.

    With ``workers > 1`` the lines are processed by a process pool (``fn`` must be
    picklable, e.g. a module-level function or a ``functools.partial`` of one).
    """
    lines = read_lines(in_path)
    if workers <= 1:
        return write_lines(out_path, map(fn, lines))
    with worker_pool(workers) as pool:
        return write_lines(out_path, pool.imap(fn, lines, chunksize=CHUNK_LINES))
