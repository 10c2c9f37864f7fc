"""Joint byte-pair encoding with subword-nmt (Sennrich et al., 2016).

The paper uses a joint source/target BPE vocabulary of 40K merge operations (section 4):
codes are learned on the concatenation of both tokenized training sides, as in Sennrich's
WMT16 ``preprocess.sh`` (``cat train.SRC train.TGT | learn_bpe.py -s N``), and applied to
every file with the ``@@ `` continuation marker. :func:`remove_bpe` undoes it on output,
like ``sed -r 's/(@@ )|(@@ ?$)//g'``.
"""
import functools
import heapq
import itertools
import logging
import math
import os
import re
from collections import Counter, defaultdict
from typing import NamedTuple, Optional, Sequence

import numpy as np
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import get_pair_statistics, replace_pair, update_pair_statistics

from ..runtime.atomic import remove_path
from ..errors import PreprocessError
from ..runtime.parallel import (LineChunk, batched, line_chunks, map_file, partition_sections, read_chunk,
                                read_section, write_partitions)
from ..runtime.progress import Progress
from ..runtime.pool import map_batches, servers
from ..textio import count_lines, decode_line, in_sample

DEFAULT_MERGES = 40000
# convs2s-prepare learns the codes from at most this many pairs of a larger corpus
# (--bpe-sample), chosen by bench/sampling.py: see the performance page.
DEFAULT_SAMPLE = 0
# Learning BPE holds about 1.5 KiB per distinct word (measured: see the performance page), so
# it learns from a sample of the lines that holds at most this many (--bpe-max-words): about
# 6 GiB whatever the corpus. bench/sampling.py measures what it changes in the codes: less
# than leaving the rarest words out for the same memory.
DEFAULT_MAX_WORDS = 4_000_000
SEPARATOR = "@@"
_BPE_MARKER = re.compile(r"(@@ )|(@@ ?$)")
# Lines per chunk of counting the words or finding the distinct ones: its result, a Counter
# or a set, is sent back whole.
COUNT_CHUNK_LINES = 50000
# Distinct words a shard of the vocabulary holds at least while the merges are learned: a
# merge costs each worker a round trip, which only shards about this large repay (40,000
# merges on 2 cores, AMD EPYC: 86,000 words 12.9 s in one shard, 20.4 in two; 255,000
# words 44.3 s and 40.8; 794,000 words 154 s and 89).
SHARD_WORDS = 100_000
# Partitions of a file's distinct words in applying BPE: a worker gathers and segments the
# words of one at a time (at 36,000,000 built lines, some 17,000 words).
WORD_PARTITIONS = 256
# _hash's values (signed 64-bit) plus this are in [0, 2 ** 64).
HASH_OFFSET = 1 << 63
# Lines whose words a worker looks up at once in applying BPE: their words, a Python object
# each, are a worker's memory, a few MB.
SEGMENT_BATCH_LINES = 1000
# Marks (a byte each) per split word in SplitWords.marked: under 1 in 8 of the others
# is searched for in vain.
MARKS_PER_WORD = 8

logger = logging.getLogger(__name__)


def _words(line: str) -> list:
    """The words of a line as subword-nmt splits it, learning (``get_vocabulary``) and
    applying (``BPE.segment``) alike; empty ones left in."""
    return line.strip("\r\n ").split(" ")


def _count_words(path: str, kept: int, total: int, chunk: LineChunk) -> tuple:
    """(lines counted, word counts) of the lines of ``chunk`` of ``path`` that a sample of
    ``kept`` of its ``total`` lines holds (:func:`..textio.spread_evenly`'s), split as
    subword-nmt's ``get_vocabulary`` splits them, in order of first occurrence."""
    counts, counted = Counter(), 0
    for number, raw in enumerate(read_chunk(path, chunk, 0), chunk.first):
        if in_sample(number - 1, kept, total):
            counts.update(filter(None, _words(decode_line(raw, path, number))))  # counted in C
            counted += 1
    return counted, counts


def count_words(paths: Sequence[str], workers: int = 1, sample: int = 0) -> Counter:
    """Word counts of ``paths`` (``sample`` lines of each spread evenly, the same pairs of
    parallel files; 0: every line), each worker reading its chunks of the files, each word
    first where it first occurs, as subword-nmt counts: its codes depend on that order (words
    of equal counts keep it when sorted)."""
    scans = [line_chunks([path], COUNT_CHUNK_LINES) for path in paths]
    totals = [total for (total,), _ in scans]
    kept = [min(sample, total) if sample else total for total in totals]
    progress = Progress("count words for BPE", sum(kept), unit="lines")
    counts = Counter()
    for path, size, total, (_, chunks) in zip(paths, kept, totals, scans):
        task = functools.partial(_count_words, path, size, total)
        for counted, chunk_counts in map_batches(task, chunks, workers):
            counts.update(chunk_counts)
            progress.update(counted)
    progress.finish()
    return counts


def count_bounded_words(paths: Sequence[str], workers: int = 1, sample: int = 0,
                        max_words: int = DEFAULT_MAX_WORDS) -> Counter:
    """:func:`count_words` of ``paths`` (``sample`` lines of each, 0: all) or, where they hold
    more than ``max_words`` distinct words (0: no bound), of a smaller sample, spread evenly,
    that holds at most that many, close to it. Its size is estimated from how the vocabulary
    grows with the lines (as a power of them, Heaps' law, the power read from the last two
    counts; the first guess takes the words in proportion to the lines, which leaves too
    many), and its words counted again until they fit: two or three counts."""
    counts = count_words(paths, workers, sample)
    if not max_words or len(counts) <= max_words:
        return counts
    total = count_lines(paths[0])
    counted = [(min(sample, total) if sample else total, len(counts))]  # (lines, words)
    while len(counts) > max_words:
        lines, words = counted[-1]
        power = 1.0
        if len(counted) > 1 and counted[-2][1] > words:
            power = min(1.0, math.log(counted[-2][1] / words) / math.log(counted[-2][0] / lines))
        lines = int(lines * (max_words / words) ** (1 / power))
        if lines < 1:
            raise PreprocessError(f"learn BPE: --bpe-max-words {max_words} is fewer words than a "
                                  f"line of {paths[0]} holds: give a larger number")
        del counts
        counts = count_words(paths, workers, lines)
        counted.append((lines, len(counts)))
    logger.info("learn BPE: %d lines hold %d distinct words, more than --bpe-max-words %d: "
                "learning from the %d words of %d lines spread evenly over them",
                *counted[0], max_words, len(counts), counted[-1][0])
    return counts


class PairFrequencies(defaultdict):
    """subword-nmt's pair frequencies, ``defaultdict(int)``, that also file each pair at
    least as frequent as ``threshold`` under its frequency, so that the most frequent pair
    is found without reading every pair (subword-nmt's ``max`` over them all, with a Python
    key, was two thirds of its learning time). The pairs below the threshold are not filed:
    when the most frequent pair is one of them, subword-nmt goes back to every pair's
    frequency anyway. It remembers the pairs changed since :meth:`prune` last ran, the only
    ones that can have fallen below the threshold since."""

    def __init__(self, frequencies: dict, threshold: float = -math.inf):
        super().__init__(int)
        self.threshold = threshold
        self.pairs_by_frequency = defaultdict(set)
        for pair, frequency in frequencies.items():
            if frequency >= threshold:
                self.pairs_by_frequency[frequency].add(pair)
        dict.update(self, frequencies)
        self.heap = [-frequency for frequency in self.pairs_by_frequency]  # lazily pruned
        heapq.heapify(self.heap)
        self.changed = None  # every pair: none pruned yet

    def __setitem__(self, pair: tuple, frequency: int) -> None:
        if pair in self:
            self._unfile(pair)
        super().__setitem__(pair, frequency)
        if frequency >= self.threshold:
            if frequency not in self.pairs_by_frequency:
                heapq.heappush(self.heap, -frequency)
            self.pairs_by_frequency[frequency].add(pair)
        if self.changed is not None:
            self.changed.add(pair)

    def __delitem__(self, pair: tuple) -> None:
        self._unfile(pair)
        super().__delitem__(pair)

    def _unfile(self, pair: tuple) -> None:
        frequency = self[pair]
        if frequency >= self.threshold:
            pairs = self.pairs_by_frequency[frequency]
            pairs.discard(pair)
            if not pairs:
                del self.pairs_by_frequency[frequency]

    def add(self, changes: dict) -> None:
        """Add each pair's change of frequency (a pair with a change of 0 is still set, as
        subword-nmt's ``-=`` and ``+=`` on it would set it)."""
        for pair, change in changes.items():
            self[pair] = self.get(pair, 0) + change

    def prune(self, big_stats: dict, threshold: float) -> None:
        """subword-nmt's ``prune_stats(self, big_stats, threshold)``: the pairs below the
        threshold leave these frequencies for ``big_stats``. Only the pairs changed since the
        last prune are read: the others were at or above the same threshold then."""
        pairs = self if self.changed is None else (pair for pair in self.changed if pair in self)
        for pair, frequency in [(pair, self[pair]) for pair in pairs]:
            if frequency < threshold:
                del self[pair]
                if frequency < 0:
                    big_stats[pair] += frequency
                else:
                    big_stats[pair] = frequency
        self.changed = set()

    def most_frequent(self) -> Optional[tuple]:
        """subword-nmt's ``max(stats, key=lambda pair: (stats[pair], pair))``, the most
        frequent pair and, of equally frequent ones, the largest, where it is at least as
        frequent as the threshold; else None."""
        while self.heap and -self.heap[0] not in self.pairs_by_frequency:
            heapq.heappop(self.heap)
        return max(self.pairs_by_frequency[-self.heap[0]]) if self.heap else None


def _merge(pair: tuple, vocab: list, indices: dict) -> dict:
    """subword-nmt's merge of ``pair`` in the words of ``vocab`` (``replace_pair``) and the
    changes it makes to the pair frequencies (``update_pair_statistics``)."""
    changes = replace_pair(pair, vocab, indices)
    frequency_changes = defaultdict(int)
    update_pair_statistics(pair, changes, frequency_changes, indices)
    return frequency_changes


def _serve_words(conn) -> None:
    """A worker of :class:`WordShards`: its words, then their pair frequencies, then each
    merge's changes to them, until it is sent None (at once where it got no shard)."""
    vocab = conn.recv()
    if vocab is None:
        return
    stats, indices = get_pair_statistics(vocab)
    conn.send(dict(stats))
    del stats
    while (pair := conn.recv()) is not None:
        conn.send(dict(_merge(pair, vocab, indices)))


def _summed(frequencies: list) -> defaultdict:
    """The first of ``frequencies`` (a ``defaultdict(int)``), the others added to it."""
    total = frequencies[0]
    for more in frequencies[1:]:
        for pair, frequency in more.items():
            total[pair] += frequency
    return total


class WordShards:
    """The words of the vocabulary dealt out to this process and the workers at the other
    end of ``connections`` (:func:`..runtime.pool.servers` running :func:`_serve_words`): each
    merge is made in every shard at once, and the changes to the pair frequencies are
    summed. Merging in the words and finding those changes is four fifths of subword-nmt's
    learning time; the sums are of integers, so the frequencies are the same for any number
    of shards. Each merge costs every worker a round trip, so a shard has at least
    :data:`SHARD_WORDS` words, and the workers left without one wait idle. They are best
    forked before the words are counted: then they share no pages of the words with this
    process, which would copy each page it frees."""

    def __init__(self, vocab: list, connections: Sequence):
        count = max(1, min(len(connections) + 1, len(vocab) // SHARD_WORDS))
        self.connections = connections[:count - 1]
        for k, conn in enumerate(self.connections, 1):
            conn.send(vocab[k::count])  # as many frequent words in each shard
        self.vocab = vocab[::count]

    def statistics(self) -> defaultdict:
        """subword-nmt's ``get_pair_statistics``'s frequencies of every shard's pairs."""
        stats, self.indices = get_pair_statistics(self.vocab)
        return _summed([stats, *(conn.recv() for conn in self.connections)])

    def merge(self, pair: tuple) -> defaultdict:
        """Merge ``pair`` in every shard: the changes to the pair frequencies."""
        for conn in self.connections:
            conn.send(pair)
        here = _merge(pair, self.vocab, self.indices)
        return _summed([here, *(conn.recv() for conn in self.connections)])


def learn_merges(counts: Counter, codes, merges: int, min_frequency: int = 2, connections: Sequence = ()) -> None:
    """Write the BPE merges that subword-nmt's ``learn_bpe`` learns from these word counts
    (dropped once read: pass the only reference).

    subword-nmt's loop with its own helpers and choices (pairs counted per word, the pruned
    statistics and their threshold, ties broken by the larger pair), so the codes are the
    same, line for line. Only the bookkeeping is faster: the most frequent pair is looked up
    in :class:`PairFrequencies` instead of found by a scan of every pair; a merge is made
    in this process's shard of the words and in those of the :class:`WordShards` workers at
    the other end of ``connections`` at once, and its changes to the pair frequencies are
    summed, then filed once per pair; and pruning reads only the pairs changed since it last
    ran.
    """
    codes.write("#version: 0.2\n")
    vocab = [(tuple(word[:-1]) + (word[-1] + "</w>",), count) for word, count in counts.items()]
    del counts
    vocab.sort(key=lambda item: item[1], reverse=True)  # stable: words of equal counts keep their order
    words = WordShards(vocab, connections)
    del vocab
    big_stats = words.statistics()
    if not big_stats:  # no word of two characters: nothing to merge (subword-nmt fails on max())
        return
    # threshold is inspired by Zipfian assumption, but should only affect speed (subword-nmt)
    threshold = max(big_stats.values()) / 10
    stats = PairFrequencies(big_stats, threshold)
    progress = Progress("learn BPE", merges, unit="merges")
    for i in range(merges):
        most_frequent = stats.most_frequent()
        if most_frequent is None:  # below the threshold, or pruned: maybe a pruned pair is the most frequent
            stats.prune(big_stats, threshold)
            stats = PairFrequencies(big_stats)
            most_frequent = stats.most_frequent()
            threshold = stats[most_frequent] * i / (i + 10000.0)
            stats.prune(big_stats, threshold)
            stats.threshold = threshold  # pruning left only the pairs at least this frequent
        if stats[most_frequent] < min_frequency:
            logger.info("learn BPE: no pair occurs %d times or more; stopping after %d merges", min_frequency, i)
            break
        codes.write("{0} {1}\n".format(*most_frequent))
        progress.update()
        stats.add(words.merge(most_frequent))
        stats[most_frequent] = 0
        if not i % 100:
            stats.prune(big_stats, threshold)
    progress.finish()


def learn_joint_bpe(train_paths: Sequence[str], codes_path: str, merges: int = DEFAULT_MERGES,
                    workers: int = 1, sample: int = 0, max_words: int = DEFAULT_MAX_WORDS) -> None:
    """Learn ``merges`` BPE operations on the concatenation of ``train_paths``.

    The words are counted, and the merges learned (:func:`learn_merges`), in ``workers``
    processes: the same codes as subword-nmt's ``learn_bpe`` on the text itself.
    ``sample``: learn from this many lines of each file, spread evenly (0: all). The merge
    loop's time and memory grow with the number of distinct words, which ``max_words`` bounds
    by a smaller sample where needed (:func:`count_bounded_words`; 0: no bound); what a sample
    changes in the segmented text is measured by ``python -m bench.sampling`` (the
    performance page).
    """
    with servers(_serve_words, workers - 1, "learn BPE") as connections, \
            open(codes_path, "w", encoding="utf-8") as codes:
        learn_merges(count_bounded_words(train_paths, workers, sample, max_words), codes, merges,
                     connections=connections)


@functools.lru_cache(maxsize=None)
def _load_codes(codes_path: str) -> BPE:
    with open(codes_path, encoding="utf-8") as codes:
        return BPE(codes, separator=SEPARATOR)


def apply_bpe(line: str, codes_path: str) -> str:
    """Segment one tokenized line with the codes in ``codes_path``."""
    return _load_codes(codes_path).segment(line)


def _partition(word: str, partitions: int) -> int:
    """The partition of ``word``: one of ``partitions`` consecutive ranges of ``_hash``'s
    values, in order, so that the partitions' words, each partition's sorted by hash, put
    one partition after the other are sorted."""
    return ((_hash(word) + HASH_OFFSET) * partitions) >> 64


def _partition_words(in_path: str, folder: str, partitions: int, chunk: LineChunk) -> tuple:
    """Write the distinct words of ``chunk`` of ``in_path`` to a file of ``folder``, a line
    each, partition after partition; return the number of lines read, the file and where
    each partition's words begin in it, and where the file ends. A line that is not UTF-8 is
    left out: reading the file again to map its lines reports it, with its number, after the
    shards before it are written."""
    words, lines = set(), 0
    for lines, raw in enumerate(read_chunk(in_path, chunk, 0), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        words.update(_words(line))
    words.discard("")  # where a line has none, or two spaces in a row
    parts = defaultdict(list)
    for word in words:
        parts[_partition(word, partitions)].append(word + "\n")
    path = os.path.join(folder, f"words-{chunk.index}")
    return lines, path, write_partitions(path, parts, partitions)


def _segment_partition(codes_path: str, sections: list) -> tuple:
    """Segment the distinct words of a partition, read from the ``sections`` (file, start,
    end) of the chunks' files that hold them; return the number of words and the partition's
    :class:`SplitWords` parts: the hashes of the words the codes split, sorted, the length of
    each one's segmentation, the segmentations in that order, and {word: segmentation} of
    the words whose hash another word shares."""
    words = set()
    for section in sections:
        words.update(read_section(*section).split("\n"))
    words.discard("")
    words = sorted(words, key=_hash)
    hashes = np.fromiter(map(_hash, words), np.int64, len(words))
    shared, equal = np.zeros(len(words), dtype=bool), hashes[1:] == hashes[:-1]
    shared[1:] |= equal  # the hash of the word before
    shared[:-1] |= equal  # of the word after
    bpe = _load_codes(codes_path)
    kept, units, collided = [], [], {}
    for word, key, collides in zip(words, hashes.tolist(), shared.tolist()):
        segmented = bpe.segment_tokens([word])
        if collides:
            collided[word] = " ".join(segmented)
        elif segmented != [word]:
            kept.append(key)
            units.append(" ".join(segmented))
    bpe.cache.clear()  # every word comes once: its cache would only hold them all again
    lengths = np.fromiter(map(len, units), np.int64, len(units))
    return len(words), np.array(kept, dtype=np.int64), lengths, "".join(units), collided


# A word's key in a SplitWords table: Python's hash, which forked workers compute as their
# parent does (a name of this module's, so that a test can make words collide).
_hash = hash


class SplitWords(NamedTuple):
    """The segmentations of the words of a file that the codes split, in arrays, not Python
    objects: forked workers that look words up in it share its pages with their parent. (A
    dict's lookup writes the reference count of the value it returns, so that every worker
    came to copy the pages of the segmentations it met: on 2,000,000 built pairs, 32 workers
    held 2.4 GiB to apply BPE.) ``hashes``: the words' ``_hash``, sorted;
    ``units[starts[k]:starts[k + 1]]``: the segmentation of the word of ``hashes[k]``;
    ``collided``: {word: its segmentation, or itself} of the words whose hash another word
    of the file shares (hardly ever any), which the arrays leave out. ``marked[hash &
    (len(marked) - 1)]`` is True for every hash of the table, and for few others: most
    words, those the codes leave whole, are known not to be split without a search."""
    hashes: np.ndarray
    starts: np.ndarray
    units: str
    collided: dict
    marked: np.ndarray

    @classmethod
    def of(cls, partitions: list) -> "SplitWords":
        """The table of the words of a file from its partitions' parts, in order
        (:func:`_segment_partition`)."""
        _, keys, lengths, units, collided = zip(*partitions)
        keys = np.concatenate(keys)
        starts = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=starts[1:])
        units = "".join(units)
        collided = {word: segmented for part in collided for word, segmented in part.items()}
        marked = np.zeros(1 << max(10, (MARKS_PER_WORD * len(keys)).bit_length()), dtype=bool)
        marked[keys & (len(marked) - 1)] = True
        return cls(keys, starts, units, collided, marked)

    def segment(self, words: list) -> list:
        """Each of ``words`` segmented (words of the file only)."""
        hashes = np.fromiter(map(_hash, words), np.int64, len(words))
        if self.collided:
            words = [self.collided.get(word, word) for word in words]
        marked = np.flatnonzero(self.marked[hashes & (len(self.marked) - 1)])
        if len(marked):
            at = np.searchsorted(self.hashes, hashes[marked])
            found = at < len(self.hashes)
            found[found] = self.hashes[at[found]] == hashes[marked[found]]
            at = at[found]
            for k, first, last in zip(marked[found].tolist(), self.starts[at].tolist(),
                                      self.starts[at + 1].tolist()):
                words[k] = self.units[first:last]
        return words


def _segment_known(split: SplitWords, lines: list) -> list:
    """``BPE.segment(line)`` of each of ``lines``, whose words ``split`` holds: the pools'
    shared state (:func:`..runtime.pool.map_batches`), which the workers get with their fork, not
    pickled with every chunk."""
    # two spaces in a row, or an empty line: subword-nmt skips the empty words
    lines_words = ([word for word in words if word] if "" in words else words
                   for words in map(_words, lines))
    segmented = []
    for batch in batched(lines_words, SEGMENT_BATCH_LINES):
        units, start = split.segment(list(itertools.chain.from_iterable(batch))), 0
        for words in batch:
            segmented.append(" ".join(units[start:start + len(words)]))
            start += len(words)
    return segmented


def segment_distinct_words(codes_path: str, in_path: str, folder: str,
                           workers: int = 1) -> SplitWords:
    """The segmentation of every word of ``in_path`` that the codes split (the others are
    segmented as themselves), each distinct word segmented once, in ``workers`` processes.

    The workers find the distinct words of chunks of the file and write them to files in
    ``folder`` (made anew, removed at the end), split by hash into :data:`WORD_PARTITIONS`
    partitions; then each partition's words are gathered, deduplicated and segmented by one
    worker, which returns them as arrays. Neither this process nor a worker holds more of
    the file's words as Python objects than a chunk's or a partition's."""
    (total,), chunks = line_chunks([in_path], COUNT_CHUNK_LINES)
    remove_path(folder)
    os.makedirs(folder)
    try:
        progress = Progress(f"find the words of {in_path}", total, unit="lines")
        found = []  # (file, offsets) of each chunk
        task = functools.partial(_partition_words, in_path, folder, WORD_PARTITIONS)
        for lines, path, offsets in map_batches(task, chunks, workers):
            found.append((path, offsets))
            progress.update(lines)
        progress.finish()
        _load_codes(codes_path)  # read once, before the workers fork
        progress = Progress(f"segment the words of {in_path}", WORD_PARTITIONS, unit="partitions")
        parts = []
        segment = functools.partial(_segment_partition, codes_path)
        for part in map_batches(segment, partition_sections(found, WORD_PARTITIONS), workers):
            parts.append(part)
            progress.update(1)
        progress.finish()
    finally:
        remove_path(folder)
    split = SplitWords.of(parts)
    logger.info("apply BPE to %s: %d distinct words, %d of them split by the codes", in_path,
                sum(part[0] for part in parts), len(split.hashes)
                + sum(word != segmented for word, segmented in split.collided.items()))
    return split


def apply_bpe_file(codes_path: str, in_path: str, out_path: str, workers: int = 1) -> int:
    """Segment every line of ``in_path`` as :func:`apply_bpe` does; return the number of lines.

    A segmented line is a function of its words alone, so each distinct word is segmented
    once (:func:`segment_distinct_words`, in ``workers`` processes), and the lines are then
    mapped with dictionary lookups in ``workers`` forked processes that share the table.
    subword-nmt's own per-word cache would segment each word again in every worker.

    The output is ``BPE.segment(line)``'s, byte for byte: a line's leading and trailing
    spaces are dropped (subword-nmt's ``apply-bpe`` command keeps them).

    Memory: the distinct words are gathered and segmented a partition at a time, in files
    that the workers write in a folder beside ``out_path`` (about 8% of the text's bytes at
    4,500,000 lines; removed at the end); then the table of those the codes split
    (:class:`SplitWords`) holds 16 bytes for each and its segmentation's characters, and 8
    to 16 more to find without a search that the others are not split, in arrays that the workers
    share with this process as forked pages, which no lookup writes: a worker's own memory
    is its chunk's lines, not the table. On 4,500,000 built German lines (935,745 distinct
    words, 922,093 split) 2 workers peaked at 212 MiB, where collecting the words in this
    process as a set and a dict of their segmentations peaked at 456 (AMD EPYC, 2 cores). A
    rerun that resumes from finished shards segments the words of the whole file again,
    then maps only the lines of the unfinished shards.
    """
    _load_codes.cache_clear()  # codes_path may have been learned again since it was read
    try:
        folder = os.path.join(os.path.dirname(os.path.abspath(out_path)),
                              f".{os.path.basename(out_path)}.words")
        split = segment_distinct_words(codes_path, in_path, folder, workers)
        return map_file(_segment_known, in_path, out_path, workers,
                        stage=f"apply BPE to {in_path}", chunked=True, shared=split)
    finally:
        _load_codes.cache_clear()


def remove_bpe(line: str) -> str:
    """Join subword units back into words: ``sed -r 's/(@@ )|(@@ ?$)//g'``."""
    return _BPE_MARKER.sub("", line)


def remove_bpe_file(in_path: str, out_path: str) -> int:
    """:func:`remove_bpe` on every line of ``in_path``; return the number of lines."""
    return map_file(remove_bpe, in_path, out_path, stage=f"remove BPE from {in_path}")
