"""Line-by-line stages on every core, in order, in bounded memory, with progress.

Tokenizing, applying BPE, cleaning, finding or counting words and decoding alignments
treat each line on their own. Handing every line to the workers would keep this process
busier than they are (on 16 cores that held tokenizing to 3.1 times the speed of 2 workers,
bench/cores.py), so this process only finds where every so many lines of the files begin
(:func:`line_chunks`, a scan of newlines), and each worker reads its chunk of the files
itself (:func:`read_chunk`); what it makes goes back as its result (:func:`.pool.map_batches`) or
to part files that this process appends to the outputs in order (:func:`map_chunks_into`,
which :func:`map_file` uses). What must be gathered by key over every chunk (the distinct
words to segment, the aligner's links to count) a chunk's worker writes to a file in
partitions (:func:`write_partitions`), and one worker a partition then reads its sections
of every chunk's file (:func:`partition_sections`, :func:`read_section`). At most a few
chunks or batches per worker are in flight: memory does not
grow with the corpus (``multiprocessing.Pool.imap`` would read the whole input ahead into its
queue).

Shards: where ``map_file``'s output is an output of a pipeline step, it is written in shards
of :func:`.shards.shard_lines` input lines that a rerun after a kill reuses
(:mod:`.shards`), each shard's chunks shared by the workers. Outside a step (nothing would
reuse them) the output is written directly.
"""
import contextlib
import functools
import itertools
import logging
import os
import shutil
from typing import BinaryIO, Callable, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from .atomic import StepOutput, remove_path, running_step, shard_folder
from ..errors import PreprocessError
from .progress import Progress
from .pool import map_batches
from .shards import Shards, shard_lines
from ..textio import check_parallel, count_lines, decode_line

logger = logging.getLogger(__name__)

# Lines a worker reads, maps and writes at a time in map_file: a chunk.
MAP_CHUNK_LINES = 10_000
# Bytes read at a time when scanning a file for where its chunks begin.
SCAN_BYTES = 1 << 20


def batched(items: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of ``size`` items (the last one shorter)."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


class LineChunk(NamedTuple):
    """Consecutive lines of files read side by side (:func:`line_chunks`)."""
    index: int
    first: int  # the number of its first line, from 1
    lines: int
    starts: Tuple[int, ...]  # the byte offset of its first line in each file


def _scan(path: str, firsts: Iterator[int]) -> Tuple[int, List[int]]:
    """(lines, offsets): the number of lines of ``path`` (a last one without a newline
    counts, as in :func:`..textio.count_lines`) and the byte offsets where the lines numbered
    ``firsts`` (from 0, increasing; it may go on past the file) begin, the file's end
    standing for the line after the last. Only ``b"\n"`` ends a line, as in
    :func:`..textio.read_lines`."""
    offsets, newlines, offset, last = [], 0, 0, b"\n"
    wanted = next(firsts, None)
    with open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            count = block.count(b"\n")
            # line L begins after the file's L-th newline: the n-th of this block
            while wanted is not None and (n := wanted - newlines) <= count:
                offsets.append(offset + len(block) - len(block.split(b"\n", n)[n]))
                wanted = next(firsts, None)
            newlines, offset, last = newlines + count, offset + len(block), block[-1:]
    return newlines + (last != b"\n"), offsets


def line_starts(path: str, every: int) -> Tuple[int, List[int]]:
    """(lines, starts): the number of lines of ``path`` and the byte offsets where its lines
    0, ``every``, 2 * ``every``... begin (the last may be the file's end, where no line
    begins)."""
    return _scan(path, itertools.count(0, every))


def line_chunks(paths: Sequence[str], chunk_lines: int) -> Tuple[List[int], List[LineChunk]]:
    """(each file's number of lines, the chunks of ``chunk_lines`` lines that the files'
    common lines make, the last one shorter)."""
    scans = [line_starts(path, chunk_lines) for path in paths]
    totals = [total for total, _ in scans]
    chunks = [LineChunk(index, first + 1, min(chunk_lines, min(totals) - first),
                        tuple(starts[index] for _, starts in scans))
              for index, first in enumerate(range(0, min(totals), chunk_lines))]
    return totals, chunks


def parallel_chunks(src_path: str, tgt_path: str, chunk_lines: int) -> Tuple[int, List[LineChunk]]:
    """(pairs, chunks) of a parallel corpus' two files (:func:`line_chunks`); files of
    different lengths fail as :func:`..textio.check_parallel` says."""
    (total, tgt_total), chunks = line_chunks([src_path, tgt_path], chunk_lines)
    if tgt_total != total:
        check_parallel(src_path, tgt_path)  # fails, naming both counts
        raise changed_while_read(src_path, total)  # it did not: a file changed since it was scanned
    return total, chunks


def read_chunk(path: str, chunk: LineChunk, file: int) -> Iterator[bytes]:
    """The lines of ``chunk`` in ``path``, the chunk's ``file``-th file, as bytes with their
    newlines."""
    with open(path, "rb") as f:
        f.seek(chunk.starts[file])
        yield from itertools.islice(f, chunk.lines)


def map_chunks_into(fn: Callable[..., object], chunks: Sequence[LineChunk],
                    outputs: Sequence[BinaryIO], folder: str, workers: int,
                    shared=None) -> Iterator[tuple]:
    """(chunk, ``fn(chunk, parts)``) for every chunk, in order, computed by ``workers``
    processes: ``fn`` writes one part file for each of ``outputs``, in ``folder``, which this
    process appends to the outputs, in order, and removes. The folder is made anew (a killed
    run's is removed first), holds the parts in flight at most, and is removed at the end,
    or when the caller stops early or fails. ``fn`` and ``shared`` (``fn(shared, chunk,
    parts)`` where given): as for :func:`.pool.map_batches`."""
    def parts(chunk: LineChunk) -> List[str]:
        return [os.path.join(folder, f"{chunk.index:06d}.{i}") for i in range(len(outputs))]

    remove_path(folder)
    os.makedirs(folder)
    results = map_batches(_chunk_task, [(fn, chunk, parts(chunk)) for chunk in chunks],
                          min(workers, len(chunks)), shared)
    try:
        with contextlib.closing(results):
            for chunk, result in zip(chunks, results):
                for path, out in zip(parts(chunk), outputs):
                    with open(path, "rb") as part:
                        shutil.copyfileobj(part, out, 1 << 20)
                    os.remove(path)
                yield chunk, result
    finally:
        remove_path(folder)


def write_partitions(path: str, parts: dict, partitions: int) -> List[int]:
    """Write the lines ``parts[p]`` (a list of str, each ending in a newline) of every
    partition ``p`` below ``partitions`` to ``path``, one partition after the other; return
    where each partition begins in the file, and where the file ends. A worker writes such a
    file for its chunk, and each partition is then read back from every chunk's file
    (:func:`partition_sections`, :func:`read_section`) by one worker."""
    offsets = [0]
    with open(path, "wb") as out:
        for partition in range(partitions):
            text = "".join(parts.get(partition, ()))
            offsets.append(offsets[-1] + out.write(text.encode("utf-8")))
    return offsets


def partition_sections(files: Sequence[Tuple[str, List[int]]], partitions: int) -> List[list]:
    """For each partition, the (file, start, end) of its section in each of ``files``, (file,
    offsets) that :func:`write_partitions` wrote."""
    return [[(path, offsets[partition], offsets[partition + 1]) for path, offsets in files]
            for partition in range(partitions)]


def read_section(path: str, start: int, end: int) -> str:
    """Bytes ``start..end`` of ``path``, decoded."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8")


# The functions below take a pool's shared state where there is one (``*shared``: nothing or
# it) and hand it on to the function they call, first.

def _chunk_task(*args) -> object:
    *shared, (fn, chunk, parts) = args
    return fn(*shared, chunk, parts)


def _each(fn: Callable[..., str], *args) -> List[str]:
    *shared, lines = args
    return [fn(*shared, line) for line in lines]


def _map_chunk(fn: Callable[..., List[str]], in_path: str, *args) -> int:
    """``fn(lines)`` of the lines of ``chunk`` of ``in_path``, written to ``parts[0]``; the
    number of lines read."""
    *shared, chunk, parts = args
    lines = [decode_line(raw, in_path, number)
             for number, raw in enumerate(read_chunk(in_path, chunk, 0), chunk.first)]
    with open(parts[0], "w", encoding="utf-8", newline="\n") as out:
        out.writelines(line + "\n" for line in fn(*shared, lines))
    return len(lines)


def _map_chunks(fn: Callable[..., List[str]], in_path: str, chunks: List[LineChunk],
                out: BinaryIO, folder: str, workers: int, progress: Progress, shared) -> None:
    task = functools.partial(_map_chunk, fn, in_path)
    for chunk, lines in map_chunks_into(task, chunks, [out], folder, workers, shared):
        if lines < chunk.lines:
            raise changed_while_read(in_path, progress.total)
        progress.update(lines)


def _chunks_of(in_path: str, total: int, ranges: List[Tuple[int, int]]) -> List[List[LineChunk]]:
    """The chunks of :data:`MAP_CHUNK_LINES` lines (shorter at a range's end) that each
    (first line from 0, lines) range of ``in_path`` makes, found in one scan of the file."""
    firsts = [list(range(first, first + count, MAP_CHUNK_LINES)) for first, count in ranges]
    lines, offsets = _scan(in_path, itertools.chain.from_iterable(firsts))
    if lines != total or len(offsets) < sum(map(len, firsts)):
        raise changed_while_read(in_path, total)
    offsets, index = iter(offsets), itertools.count()
    return [[LineChunk(next(index), start + 1, min(MAP_CHUNK_LINES, first + count - start),
                       (next(offsets),)) for start in starts]
            for (first, count), starts in zip(ranges, firsts)]


def parts_folder(path: str) -> str:
    """The hidden folder beside the output ``path`` where :func:`map_chunks_into`'s parts go."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.parts")


def map_file(fn: Callable, in_path: str, out_path: str, workers: int = 1,
             stage: Optional[str] = None, chunked: bool = False, shared=None) -> int:
    """Write ``fn(line)`` for every line of ``in_path`` to ``out_path``, in order, ``fn``
    applied in ``workers`` processes that each read, map and write chunks of the file
    (:func:`map_chunks_into`); return the number of lines. ``chunked``: ``fn`` maps a
    chunk's lines (a list of :data:`MAP_CHUNK_LINES` or fewer) to theirs at once.
    ``shared``: the workers' state, passed to ``fn`` first (:func:`.pool.map_batches`). Logs
    ``stage``'s progress in lines. Where ``out_path`` is an output of a running step, in
    shards that a rerun reuses (see the module's documentation)."""
    total = count_lines(in_path)
    progress = Progress(stage or f"{os.path.basename(in_path)} -> {out_path}", total, unit="lines")
    step = running_step(out_path)
    chunk_fn = fn if chunked else functools.partial(_each, fn)
    if step is not None:
        _map_file_in_shards(chunk_fn, describe(fn), in_path, out_path, workers, progress, step,
                            shared)
    else:
        (chunks,) = _chunks_of(in_path, total, [(0, total)])
        with open(out_path, "wb") as out:
            _map_chunks(chunk_fn, in_path, chunks, out, parts_folder(out_path), workers, progress,
                        shared)
    progress.finish()
    return progress.done


def describe(fn: Callable) -> str:
    """``module.name(arguments)`` of a function or a ``functools.partial`` of one."""
    if isinstance(fn, functools.partial):
        arguments = [repr(arg) for arg in fn.args]
        arguments += [f"{key}={value!r}" for key, value in sorted(fn.keywords.items())]
        return f"{describe(fn.func)}({', '.join(arguments)})"
    return f"{fn.__module__}.{fn.__qualname__}"


def changed_while_read(path: str, total: int) -> PreprocessError:
    return PreprocessError(f"{path} changed while it was read ({total:,} lines when counted): "
                           "make sure nothing writes it, and run the command again")


def _map_file_in_shards(fn: Callable[..., List[str]], function: str, in_path: str,
                        out_path: str, workers: int, progress: Progress, step: StepOutput,
                        shared) -> None:
    size, total = shard_lines(), progress.total
    sizes = [min(size, total - start) for start in range(0, total, size)]
    shards = Shards(shard_folder(step.path), {"input": step.sha256(in_path), "function": function,
                                              "shard_lines": size, **step.derived_from},
                    sizes, progress.stage)
    progress.resume(shards.lines_done)
    chunks = _chunks_of(in_path, total, [(index * size, sizes[index]) for index in shards.todo])
    for index, shard_chunks in zip(shards.todo, chunks):
        with shards.writing(index) as (temp, _):
            with open(temp, "wb") as out:
                _map_chunks(fn, in_path, shard_chunks, out, os.path.join(shards.folder, "parts"),
                            workers, progress, shared)
    with open(out_path, "wb") as out:
        shards.join(out)
