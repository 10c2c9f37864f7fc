"""Binarization of the BPE (or word-level) text: ``fairseq-preprocess``'s output, every core busy.

fairseq's standard data preparation for ConvS2S: build the dictionary (one dictionary
shared by both languages with ``--joined-dictionary``, the natural choice for joint BPE,
or reuse ``--srcdict``) and write ``dict.*.txt`` and the ``*.bin``/``*.idx`` datasets that
``fairseq-train`` reads, with fairseq's own code: ``task.build_dictionary`` (which counts
in ``workers`` processes), its ``VocabularyDatasetBinarizer`` and its
``MMapIndexedDatasetBuilder``.

Only the driving differs from ``fairseq-preprocess --workers N``. fairseq's
``FileBinarizer.multiprocess_dataset`` hands chunks 2..N to a pool of N-1 processes, *joins*
the pool, and only then binarizes chunk 1 in the main process: N workers give about N/2
times the speed, and 2 give none. Here every chunk goes to a pool of N processes
(fairseq's ``_binarize_chunk_and_finalize``), and the main process merges the chunks'
files in order with the builder's ``merge_file_``, as fairseq does. The files are
byte-identical to ``fairseq-preprocess``'s for any number of workers
(``tests/test_preprocess.py``).

``preprocess.log`` in the output folder holds the summary lines fairseq's writes
(``[LANG] FILE: N sents, M tokens, X% replaced (by <unk>)``).

Not resumable: an interrupted binarization starts over, unlike tokenizing and applying BPE
(:mod:`.parallel`'s shards), although at the measured rates it is the longest of the
line-by-line stages (about 2.7 hours for 36M pairs on 2 cores, docs/performance.md). Keeping
its chunks is not simple: every chunk's ids depend on the dictionary, which a full counting
pass over the training text builds at the start of the step, so a resumed run would count
every word again before reusing anything unless the dictionary were kept too, as shards of
their own kind; the chunks are byte ranges whose number follows ``--workers``; and each is a
``.bin``/``.idx`` pair that fairseq's private ``_binarize_chunk_and_finalize`` writes under
names it chooses, with a summary (the replaced words) that ``preprocess.log`` needs.
"""
import logging
import os
from typing import Optional

from .errors import PreprocessError
from .parallel import map_batches
from .progress import Progress
from .textio import count_lines

logger = logging.getLogger(__name__)

DATASET_IMPL = "mmap"  # fairseq-preprocess's default
# Chunks per worker: several, so that progress is reported while a split is binarized.
CHUNKS_PER_WORKER = 4
LOG_FILE = "preprocess.log"


def _binarize_chunk(task: tuple):
    """Binarize one byte range of a text file into ``PREFIX.bin``/``.idx`` (a worker's job)."""
    from fairseq.binarizer import FileBinarizer, VocabularyDatasetBinarizer
    vocab, path, start, end, prefix = task
    summary = FileBinarizer._binarize_chunk_and_finalize(
        VocabularyDatasetBinarizer(vocab, append_eos=True), path, start, end, prefix,
        DATASET_IMPL, vocab_size=len(vocab))
    return prefix, summary


def binarize_file(vocab, in_path: str, out_prefix: str, workers: int):
    """``OUT_PREFIX.bin``/``.idx`` from the lines of ``in_path``; fairseq's BinarizeSummary."""
    from fairseq.binarizer import BinarizeSummary
    from fairseq.data import indexed_dataset
    from fairseq.file_chunker_utils import find_offsets

    offsets = find_offsets(in_path, max(1, workers * CHUNKS_PER_WORKER if workers > 1 else 1))
    chunks = [(vocab, in_path, start, end, f"{out_prefix}.pt{number}")
              for number, (start, end) in enumerate(zip(offsets, offsets[1:]))]
    progress = Progress(f"binarize {in_path}", count_lines(in_path), unit="lines")
    builder = indexed_dataset.make_builder(indexed_dataset.data_file_path(out_prefix),
                                           impl=DATASET_IMPL, vocab_size=len(vocab))
    total = BinarizeSummary()
    for prefix, summary in map_batches(_binarize_chunk, chunks, workers):
        builder.merge_file_(prefix)
        for path in (indexed_dataset.data_file_path(prefix), indexed_dataset.index_file_path(prefix)):
            os.remove(path)
        total.merge(summary)
        progress.update(summary.num_seq)
    builder.finalize(indexed_dataset.index_file_path(out_prefix))
    progress.finish()
    return total


def build_dictionary(task, paths: list, nwords: int, workers: int):
    """fairseq-preprocess's dictionary of ``paths`` (threshold 0, padding factor 8)."""
    return task.build_dictionary(paths, workers=workers, threshold=0, nwords=nwords,
                                 padding_factor=8)


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
    from fairseq.tasks.translation import TranslationTask

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
        src_dict = Dictionary.load(srcdict)
        tgt_dict = src_dict if joined_dictionary else build_dictionary(
            TranslationTask, [train[tgt_lang]], nwords, workers)
    elif joined_dictionary:
        src_dict = tgt_dict = build_dictionary(TranslationTask, list(train.values()), nwords,
                                               workers)
    else:
        src_dict, tgt_dict = (build_dictionary(TranslationTask, [train[lang]], nwords, workers)
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
