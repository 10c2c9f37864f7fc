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

Not resumable: an interrupted binarization starts over, unlike tokenizing and applying BPE
(:mod:`.parallel`'s shards). Every chunk's ids depend on the dictionary, which a full
counting pass over the training text builds at the start of the step, so a resumed run would
count every word again before reusing anything unless the dictionary were kept too.
"""
import logging
import os
import shutil
import struct
from collections import Counter, deque
from typing import Iterator, List, Optional

from .errors import PreprocessError
from .parallel import map_batches
from .progress import Progress
from .textio import count_lines, read_lines

logger = logging.getLogger(__name__)

# Chunks per worker: several, so that progress is reported while a split is binarized.
CHUNKS_PER_WORKER = 4
# Bytes of text split and encoded at a time.
BLOCK_BYTES = 1 << 20
LOG_FILE = "preprocess.log"


def _chunks(path: str, workers: int, per_worker: int = CHUNKS_PER_WORKER) -> List[tuple]:
    """Consecutive (start, end) byte ranges of ``path`` that hold whole lines: the whole file
    for one worker, else ``per_worker`` per worker."""
    parts = workers * per_worker if workers > 1 else 1
    size = os.path.getsize(path)
    offsets = [0]
    with open(path, "rb") as f:
        for part in range(1, parts):
            f.seek(size * part // parts)
            f.readline()
            offsets.append(f.tell())
    offsets.append(size)
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


# The dictionary that _binarize_chunk looks words up in, set before the pool's workers fork,
# which share it: in each chunk's task this process would pickle it once per chunk (tens of
# MB for a word-level vocabulary).
_vocabulary = {"dictionary": None}


def _binarize_chunk(task: tuple):
    """Write the ids of a byte range's lines to ``OUT_PATH`` (a worker's job); return the
    path, the lines' lengths (eos included) and fairseq's BinarizeSummary."""
    import numpy as np
    from fairseq.binarizer import BinarizeSummary
    from fairseq.data.indexed_dataset import best_fitting_int_dtype

    path, start, end, out_path = task
    vocab = _vocabulary["dictionary"]
    get, unk, eos = vocab.indices.get, vocab.unk_index, vocab.eos_index
    dtype = best_fitting_int_dtype(len(vocab))
    sizes, replaced = [], Counter()
    with open(out_path, "wb") as out:
        for text in _text_blocks(path, start, end):
            ids = []
            lines = text.split("\n")
            if not lines[-1]:  # after the last line's \n
                lines.pop()
            for line in lines:
                words = line.split()
                line_ids = [get(word, unk) for word in words]
                if unk in line_ids:  # counted as fairseq's binarizer counts them
                    replaced.update(word for word, idx in zip(words, line_ids)
                                    if idx == unk and word != vocab.unk_word)
                line_ids.append(eos)
                ids += line_ids
                sizes.append(len(line_ids))
            out.write(np.array(ids, dtype=dtype).tobytes())
    summary = BinarizeSummary(num_seq=len(sizes), replaced=replaced if sizes else None,
                              num_tok=sum(sizes))
    return out_path, np.array(sizes, dtype=np.int32), summary


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


def binarize_file(vocab, in_path: str, out_prefix: str, workers: int):
    """``OUT_PREFIX.bin``/``.idx`` from the lines of ``in_path``; fairseq's BinarizeSummary."""
    from fairseq.binarizer import BinarizeSummary
    from fairseq.data.indexed_dataset import (best_fitting_int_dtype, data_file_path,
                                              index_file_path)

    chunks = [(in_path, start, end, data_file_path(f"{out_prefix}.pt{number}"))
              for number, (start, end) in enumerate(_chunks(in_path, workers))]
    progress = Progress(f"binarize {in_path}", count_lines(in_path), unit="lines")
    sizes, total = [], BinarizeSummary()
    _vocabulary["dictionary"] = vocab
    try:
        with open(data_file_path(out_prefix), "wb") as out:
            for chunk_path, chunk_sizes, summary in map_batches(_binarize_chunk, chunks, workers):
                with open(chunk_path, "rb") as chunk:
                    shutil.copyfileobj(chunk, out)
                os.remove(chunk_path)
                sizes.append(chunk_sizes)
                total.merge(summary)
                progress.update(summary.num_seq)
    finally:
        _vocabulary["dictionary"] = None
    write_index(index_file_path(out_prefix), best_fitting_int_dtype(len(vocab)), sizes)
    progress.finish()
    return total


def binarize(destdir: str, src_lang: str, tgt_lang: str, trainpref: Optional[str] = None,
             validpref: Optional[str] = None, testpref: Optional[str] = None,
             srcdict: Optional[str] = None, joined_dictionary: bool = True, nwords: int = -1,
             workers: int = 1) -> None:
    """What ``fairseq-preprocess --source-lang SRC --target-lang TGT --destdir DESTDIR
    [--joined-dictionary] [--srcdict] [--nwordssrc/tgt NWORDS] --workers N`` writes.

    Input files are ``PREFIX.LANG``; ``nwords`` caps the (joined) vocabulary, for
    word-level models (-1 keeps every word).
    """
    from fairseq.data import Dictionary

    prefixes = {"train": trainpref, "valid": validpref, "test": testpref}
    for prefix in filter(None, prefixes.values()):
        for lang in (src_lang, tgt_lang):
            if not os.path.isfile(f"{prefix}.{lang}"):
                raise PreprocessError(f"binarize: input file not found: {prefix}.{lang}")
    if not srcdict and not trainpref:
        raise PreprocessError("binarize: a training prefix or --srcdict is needed to build the "
                              "dictionary")
    os.makedirs(destdir, exist_ok=True)
    train = {lang: f"{trainpref}.{lang}" for lang in (src_lang, tgt_lang)}
    if not srcdict or not joined_dictionary:
        logger.info("binarize: counting the words of %s in %d processes for the dictionary",
                    " and ".join(train.values()), workers)
    if srcdict:
        try:
            src_dict = Dictionary.load(srcdict)
        except Exception as exc:  # fairseq's ValueError quoting the line, or a bare Exception
            reason = " ".join(str(exc).split())
            raise PreprocessError(f"--srcdict {srcdict}: not a fairseq dictionary ({reason}): give "
                                  "a dict.LANG.txt that fairseq-preprocess or convs2s-prepare "
                                  "wrote, one 'word count' a line") from None
        tgt_dict = src_dict if joined_dictionary else build_dictionary(
            [train[tgt_lang]], nwords, workers)
    elif joined_dictionary:
        src_dict = tgt_dict = build_dictionary(list(train.values()), nwords, workers)
    else:
        src_dict, tgt_dict = (build_dictionary([train[lang]], nwords, workers)
                              for lang in (src_lang, tgt_lang))
    src_dict.save(os.path.join(destdir, f"dict.{src_lang}.txt"))
    tgt_dict.save(os.path.join(destdir, f"dict.{tgt_lang}.txt"))

    with open(os.path.join(destdir, LOG_FILE), "w", encoding="utf-8") as log:
        for lang, vocab in ((src_lang, src_dict), (tgt_lang, tgt_dict)):
            for split, prefix in prefixes.items():
                if prefix:
                    in_path = f"{prefix}.{lang}"
                    out_prefix = os.path.join(destdir, f"{split}.{src_lang}-{tgt_lang}.{lang}")
                    summary = binarize_file(vocab, in_path, out_prefix, workers)
                    line = f"[{lang}] {in_path}: {summary} (by {vocab.unk_word})"
                    logger.info(line)
                    log.write(line + "\n")
