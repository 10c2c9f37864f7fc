"""Binarization of the BPE (or word-level) text: ``fairseq-preprocess``'s output, every core busy.

fairseq's standard data preparation for ConvS2S: build the dictionary (one dictionary
shared by both languages with ``--joined-dictionary``, the natural choice for joint BPE,
or reuse ``--srcdict``) and write ``dict.*.txt`` and the ``*.bin``/``*.idx`` datasets that
``fairseq-train`` reads. The files are byte-identical to ``fairseq-preprocess``'s for any
number of workers (``tests/test_preprocess.py``, ``tests/test_binarize.py``).

What is fairseq's: the ``Dictionary`` (``add_symbol``, ``finalize``, which orders the words
by count and then by spelling, ``save``, ``load``), the index format
(``MMapIndexedDataset.Index.writer``), the data type of the ids (``best_fitting_int_dtype``),
the file names and ``BinarizeSummary``, whose lines ``preprocess.log`` in the output folder
holds, as fairseq's does (``[LANG] FILE: N sents, M tokens, X% replaced (by <unk>)``).

What is ours: reading, counting and encoding. fairseq's do it a word at a time in Python
(``Counter.update([word])``, ``Dictionary.encode_line`` with a method call and a tensor
write per word, a text-mode ``tell()`` per line); here whole blocks of lines are split by
``str.split`` (which splits where fairseq's ``tokenize_line`` does) and counted by
``Counter`` or looked up in the dictionary's ``dict``. For 500,000 built pairs that is 33
CPU-seconds against ``fairseq-preprocess``'s 307, some 9 of each being the import of fairseq
and torch (``bench.scaling``, docs/performance.md). The chunks are byte ranges of whole lines
in ``workers`` processes (``fairseq-preprocess --workers 2`` leaves one idle), written to
files that this process concatenates in order.

Two departures, where fairseq's output is wrong. A line ends at ``\\n`` only, as everywhere
else in the pipeline (a ``\\r`` before it is whitespace): fairseq's text-mode reader also
ends one at a lone ``\\r`` (the Moses tokenizer removes them), after which its chunk offsets
are no longer byte positions and its output depends on ``--workers``. And the index is
written with 64-bit byte offsets, as ``fairseq-preprocess --workers 1`` writes it: its
builder merges other workers' lengths as NumPy int32 scalars, whose byte offsets wrap past
2 GiB of ``.bin`` under NumPy 2.

The index's bytes are fairseq's ``MMapIndexedDataset.Index.writer``'s, written a chunk of
lines at a time (:func:`write_index`): fairseq's writer takes the lengths as a list and
builds a Python list of every line's offset, some 40 bytes a line, which made binarizing
36,000,000 built pairs peak at 2.6 GiB; here a line costs the 4 bytes of its length.

Resumable in a step (:func:`..runtime.atomic.run_step`, as ``convs2s-prepare`` runs it): the
dictionaries and each file's ids are kept in shards (:mod:`..runtime.shards`) in the step's
``.NAME.shards/`` folder, where a rerun after a kill finds them: ``dict.LANG.txt`` once the
words are counted, and ``SPLIT.LANG/`` with a shard of the ids and the lines' lengths per
:func:`..runtime.shards.shard_lines` lines of the text. A rerun derived from the same inputs and
options loads the dictionaries instead of counting again, binarizes the shards not yet
finished, and puts the files together from the shards.
"""
import contextlib
import itertools
import logging
import os
import struct
from collections import Counter, deque
from operator import itemgetter
from typing import BinaryIO, Iterable, Iterator, List, Optional

from ..runtime.atomic import atomic_outputs, running_step
from ..errors import PreprocessError
from ..runtime.parallel import changed_while_read, line_starts
from ..runtime.progress import Progress
from ..runtime.pool import map_batches, stopping_deferred
from ..runtime.shards import Shards, shard_lines, step_folder
from ..textio import count_lines, read_lines

logger = logging.getLogger(__name__)

# Chunks per worker: several, so that progress is reported while a split is binarized.
CHUNKS_PER_WORKER = 4
# Bytes of text split and encoded at a time, and copied at a time.
BLOCK_BYTES = 1 << 20
LOG_FILE = "preprocess.log"


def _chunks(path: str, workers: int, per_worker: int = CHUNKS_PER_WORKER, start: int = 0,
            end: Optional[int] = None) -> List[tuple]:
    """Consecutive (start, end) byte ranges that hold whole lines of bytes ``start..end`` of
    ``path`` (where lines begin and end; by default the whole file): the whole range for one
    worker, else ``per_worker`` per worker."""
    parts = workers * per_worker if workers > 1 else 1
    end = os.path.getsize(path) if end is None else end
    offsets = [start]
    with open(path, "rb") as f:
        for part in range(1, parts):
            f.seek(start + (end - start) * part // parts)
            f.readline()
            offsets.append(f.tell())
    offsets.append(end)
    return list(zip(offsets, offsets[1:]))


def _text_blocks(path: str, start: int, end: int) -> Iterator[str]:
    """The whole lines in bytes ``start..end`` of ``path``, decoded, about BLOCK_BYTES at a time."""
    with open(path, "rb") as f:
        f.seek(start)
        while f.tell() < end:
            block = f.read(min(BLOCK_BYTES, end - f.tell()))
            if f.tell() < end:
                block += f.readline()
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError:  # read_lines names the line and the fix
                deque(read_lines(path), maxlen=0)
                raise
            yield text


def _count_words(task: tuple) -> Counter:
    """How often each word occurs in a byte range, and the end of sentence once per line."""
    path, start, end, eos_word = task
    counts, lines = Counter(), 0
    for text in _text_blocks(path, start, end):
        counts.update(text.split())
        lines += text.count("\n") + (not text.endswith("\n"))  # a last line without \n
    counts[eos_word] += lines
    return counts


def build_dictionary(paths: list, nwords: int, workers: int):
    """fairseq-preprocess's dictionary of ``paths`` (threshold 0, padding factor 8)."""
    from fairseq.data import Dictionary

    vocab, counts = Dictionary(), Counter()
    for path in paths:  # one chunk per worker: this process merges what each one counted
        tasks = [(path, start, end, vocab.eos_word) for start, end in _chunks(path, workers, 1)]
        for chunk_counts in map_batches(_count_words, tasks, workers):
            counts.update(chunk_counts)
    for word, count in counts.items():  # in any order: finalize sorts by count, then spelling
        vocab.add_symbol(word, count)
    vocab.finalize(threshold=0, nwords=nwords, padding_factor=8)
    return vocab


def _binarize_chunk(vocab, task: tuple) -> tuple:
    """Write the ids of a byte range's lines to ``OUT_PATH`` (a worker's job); return the
    path, the lines' lengths (eos included) and how many words ``<unk>`` replaced, counted
    as fairseq's binarizer counts them. ``vocab``: the pool's shared state
    (:func:`..runtime.pool.map_batches`), which the workers get with their fork: pickled with each
    chunk's task, it would cost tens of MB a chunk for a word-level vocabulary."""
    import numpy as np
    from fairseq.data.indexed_dataset import best_fitting_int_dtype

    path, start, end, out_path = task
    get, unk, eos = vocab.indices.get, vocab.unk_index, vocab.eos_index
    dtype = best_fitting_int_dtype(len(vocab))
    sizes, replaced = [], 0
    with open(out_path, "wb") as out:
        for text in _text_blocks(path, start, end):
            ids = []
            lines = text.split("\n")
            if not lines[-1]:  # after the last line's \n
                lines.pop()
            for line in lines:
                words = line.split()
                line_ids = [get(word, unk) for word in words]
                if unk in line_ids:
                    replaced += sum(idx == unk and word != vocab.unk_word
                                    for word, idx in zip(words, line_ids))
                line_ids.append(eos)
                ids += line_ids
                sizes.append(len(line_ids))
            out.write(np.array(ids, dtype=dtype).tobytes())
    return out_path, np.array(sizes, dtype=np.int32), replaced


def _binarized(vocab, in_path: str, shards: List[List[tuple]], out_prefix: str,
               workers: int) -> Iterator[tuple]:
    """(shard, part file, lengths, words replaced) for every chunk of ``shards`` (lists of
    byte ranges of ``in_path``), in order: ``workers`` processes write the ids in ``vocab``
    of each chunk to a part file beside ``out_prefix``, which the caller appends and removes."""
    chunks = [(shard, start, end) for shard, ranges in enumerate(shards) for start, end in ranges]
    tasks = [(in_path, start, end, f"{out_prefix}.pt{number}.bin")
             for number, (_, start, end) in enumerate(chunks)]
    with contextlib.closing(map_batches(_binarize_chunk, tasks, workers, vocab)) as results:
        for (shard, _, _), result in zip(chunks, results):
            yield (shard, *result)


def _append_parts(results: Iterable[tuple], out: BinaryIO, progress: Progress) -> tuple:
    """Append the part file of each of ``results`` (:func:`_binarized`'s) to ``out`` and
    remove it; (the chunks' lengths, the words replaced in them)."""
    sizes, replaced = [], 0
    for _, part, chunk_sizes, chunk_replaced in results:
        with open(part, "rb") as f:
            while block := f.read(BLOCK_BYTES):
                out.write(block)
        os.remove(part)
        sizes.append(chunk_sizes)
        replaced += chunk_replaced
        progress.update(len(chunk_sizes))
    return sizes, replaced


def write_index(path: str, dtype, chunk_sizes: list) -> None:
    """fairseq's index of a ``.bin`` of ``dtype`` ids whose lines have the lengths
    ``chunk_sizes`` (int32 arrays, chunk after chunk): its ``Index.writer``'s header, then
    every length (int32), then every line's byte offset (int64), a chunk at a time."""
    import numpy as np
    from fairseq.data.indexed_dataset import MMapIndexedDataset, _dtype_header_code

    itemsize = np.dtype(dtype).itemsize
    with open(path, "wb") as out:
        out.write(MMapIndexedDataset.Index._HDR_MAGIC + struct.pack("<Q", 1)
                  + struct.pack("<B", _dtype_header_code(dtype)))
        out.write(struct.pack("<Q", sum(map(len, chunk_sizes))))
        for sizes in chunk_sizes:
            out.write(sizes.astype(np.int32).tobytes())
        offset = 0
        for sizes in chunk_sizes:
            ends = offset + np.cumsum(sizes, dtype=np.int64) * itemsize
            out.write((ends - sizes.astype(np.int64) * itemsize).tobytes())
            offset = int(ends[-1]) if len(ends) else offset


def _summary(vocab, lines: int, tokens: int, replaced: int):
    """fairseq's BinarizeSummary of a file, for its line in the log."""
    from fairseq.binarizer import BinarizeSummary

    return BinarizeSummary(num_seq=lines, num_tok=tokens,
                           replaced=Counter({vocab.unk_word: replaced}) if lines else None)


def binarize_file(vocab, in_path: str, out_prefix: str, workers: int,
                  shards_in: Optional[str] = None, derived_from: Optional[dict] = None):
    """``OUT_PREFIX.bin``/``.idx`` from the lines of ``in_path``; fairseq's BinarizeSummary.
    With ``shards_in``, a folder, in shards there that a run derived from the same
    ``derived_from`` (the step's origin, which decides the dictionary) reuses (:mod:`..runtime.shards`)."""
    from fairseq.data.indexed_dataset import (best_fitting_int_dtype, data_file_path,
                                              index_file_path)

    stage = f"binarize {in_path}"
    if shards_in is None:
        progress = Progress(stage, count_lines(in_path), unit="lines")
        results = _binarized(vocab, in_path, [_chunks(in_path, workers)], out_prefix, workers)
        with contextlib.closing(results), open(data_file_path(out_prefix), "wb") as out:
            sizes, replaced = _append_parts(results, out, progress)
    else:
        progress, sizes, replaced = _binarize_in_shards(vocab, in_path, out_prefix, workers,
                                                        stage, shards_in, derived_from)
    write_index(index_file_path(out_prefix), best_fitting_int_dtype(len(vocab)), sizes)
    progress.finish()
    return _summary(vocab, progress.total, sum(int(s.sum()) for s in sizes), replaced)


def _binarize_in_shards(vocab, in_path: str, out_prefix: str, workers: int, stage: str,
                        folder: str, derived_from: dict) -> tuple:
    """Binarize the shards of ``in_path`` not yet finished in ``folder``, each a shard file
    of the ids then the lines' lengths (int32), and put the ``.bin`` together from them;
    (the progress, every shard's lengths, the words replaced)."""
    import numpy as np
    from fairseq.data.indexed_dataset import data_file_path

    size = shard_lines()
    total, starts = line_starts(in_path, size)
    lines = [min(size, total - first) for first in range(0, total, size)]
    ends = starts[1:len(lines)] + [os.path.getsize(in_path)]
    progress = Progress(stage, total, unit="lines")
    shards = Shards(folder, {**derived_from, "shard_lines": size}, lines, stage)
    progress.resume(shards.lines_done)
    todo = shards.todo
    chunks = [_chunks(in_path, workers, start=starts[index], end=ends[index]) for index in todo]
    with contextlib.closing(_binarized(vocab, in_path, chunks, out_prefix, workers)) as results:
        for index, (_, shard_chunks) in zip(todo, itertools.groupby(results, key=itemgetter(0))):
            with shards.writing(index) as (temp, entry), open(temp, "wb") as out:
                shard_sizes, entry["replaced"] = _append_parts(shard_chunks, out, progress)
                shard_sizes = np.concatenate(shard_sizes)
                if len(shard_sizes) != lines[index]:
                    raise changed_while_read(in_path, total)
                entry["ids_bytes"] = out.tell()
                out.write(shard_sizes.tobytes())

    sizes, replaced = [], 0
    with open(data_file_path(out_prefix), "wb") as out:
        for index in range(len(lines)):
            entry = shards.entry(index)
            with open(shards.path(index), "rb") as shard:
                for _ in range(0, entry["ids_bytes"], BLOCK_BYTES):
                    out.write(shard.read(min(BLOCK_BYTES, entry["ids_bytes"] - shard.tell())))
                sizes.append(np.frombuffer(shard.read(), dtype=np.int32))
            replaced += entry["replaced"]
    return progress, sizes, replaced


def _dictionaries(train: dict, srcdict: Optional[str], joined_dictionary: bool, nwords: int,
                  workers: int) -> list:
    """[the source dictionary, the target one] (the same one if joined) of the training
    files ``train`` ({lang: path}, source first) or ``srcdict``."""
    from fairseq.data import Dictionary

    if not srcdict or not joined_dictionary:
        logger.info("binarize: counting the words of %s in %d processes for the dictionary",
                    " and ".join(train.values()), workers)
    if not srcdict:
        if joined_dictionary:
            return [build_dictionary(list(train.values()), nwords, workers)] * 2
        return [build_dictionary([path], nwords, workers) for path in train.values()]
    try:
        src_dict = Dictionary.load(srcdict)
    except Exception as exc:  # fairseq's ValueError quoting the line, or a bare Exception
        reason = " ".join(str(exc).split())
        raise PreprocessError(f"--srcdict {srcdict}: not a fairseq dictionary ({reason}): give "
                              "a dict.LANG.txt that fairseq-preprocess or convs2s-prepare "
                              "wrote, one 'word count' a line") from None
    if joined_dictionary:
        return [src_dict, src_dict]
    return [src_dict, build_dictionary([list(train.values())[1]], nwords, workers)]


def binarize(destdir: str, src_lang: str, tgt_lang: str, trainpref: Optional[str] = None,
             validpref: Optional[str] = None, testpref: Optional[str] = None,
             srcdict: Optional[str] = None, joined_dictionary: bool = True, nwords: int = -1,
             workers: int = 1) -> None:
    """What ``fairseq-preprocess --source-lang SRC --target-lang TGT --destdir DESTDIR
    [--joined-dictionary] [--srcdict] [--nwordssrc/tgt NWORDS] --workers N`` writes.

    Input files are ``PREFIX.LANG``; ``nwords`` caps the (joined) vocabulary, for
    word-level models (-1 keeps every word). Where ``destdir`` is the output of a running
    step, in shards that a rerun reuses (see the module's documentation).
    """
    with stopping_deferred():  # Ctrl-C in torch's import would abort, not be one line
        from fairseq.data import Dictionary

    langs = (src_lang, tgt_lang)
    prefixes = {"train": trainpref, "valid": validpref, "test": testpref}
    for prefix in filter(None, prefixes.values()):
        for lang in langs:
            if not os.path.isfile(f"{prefix}.{lang}"):
                raise PreprocessError(f"binarize: input file not found: {prefix}.{lang}")
    if not srcdict and not trainpref:
        raise PreprocessError("binarize: a training prefix or --srcdict is needed to build the "
                              "dictionary")
    os.makedirs(destdir, exist_ok=True)
    step, folder = running_step(destdir), None
    if step:  # the dictionaries and shards of an interrupted run are kept in its shard folder
        folder = step_folder(step, "binarize")
        kept = [os.path.join(folder, f"dict.{lang}.txt") for lang in langs]
    if folder and all(map(os.path.isfile, kept)):
        logger.info("binarize: the dictionaries of the interrupted run: %s", " ".join(kept))
        dictionaries = [Dictionary.load(path) for path in kept]
    else:
        dictionaries = _dictionaries({lang: f"{trainpref}.{lang}" for lang in langs}, srcdict,
                                     joined_dictionary, nwords, workers)
        if folder:
            with atomic_outputs(kept) as temps:
                for vocab, temp in zip(dictionaries, temps):
                    vocab.save(temp)
    for lang, vocab in zip(langs, dictionaries):
        vocab.save(os.path.join(destdir, f"dict.{lang}.txt"))

    with open(os.path.join(destdir, LOG_FILE), "w", encoding="utf-8") as log:
        for lang, vocab in zip(langs, dictionaries):
            for split, prefix in prefixes.items():
                if prefix:
                    in_path = f"{prefix}.{lang}"
                    out_prefix = os.path.join(destdir, f"{split}.{src_lang}-{tgt_lang}.{lang}")
                    shards_in = folder and os.path.join(folder, f"{split}.{lang}")
                    summary = binarize_file(vocab, in_path, out_prefix, workers, shards_in,
                                            step and step.derived_from)
                    line = f"[{lang}] {in_path}: {summary} (by {vocab.unk_word})"
                    logger.info(line)
                    log.write(line + "\n")
