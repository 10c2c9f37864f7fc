"""fast_align's model, trained on every core: the same model for any number of them.

fast_align (Dyer et al., 2013; clab/fast_align) learns t(f|e), the probability of target
word f given source word e, and the diagonal tension by EM. Each pass over the corpus (its
``ITERATION``) computes, for every target word f_j (j from 1) of a pair with m target and n
source words, the posterior of its link to each source word e_i and to NULL,

    p(a_j = i) ∝ t(f_j | e_i) * (1 - p0) * exp(-tension * |i/n - j/m|) / Z_j     (-d)
    p(a_j = 0) ∝ t(f_j | NULL) * p0,        p0 = 0.08

(without -d the prior is 1/(n+1) for every i and NULL), and adds it to the expected count
c(e_i, f_j). After the pass the counts become the table: with -v, the Dirichlet prior's
t(f|e) = exp(digamma(c(e,f) + alpha) - digamma(sum over f of (c(e,f) + alpha))), alpha 0.01
and fast_align's own digamma series; without it, c(e,f) over its row's sum. From the second
pass on, -o moves the tension by 8 gradient steps so that the prior's expected
-|i/n - j/m| ("model al-feat") meets the posterior's ("posterior al-feat"). The first pass
has no table yet: every t(f|e) is 1e-9, so its posteriors are the prior's. fast_align makes
5 passes and exports the table as the 4th left it (its 5th only decodes, which
:mod:`.fastalign` does on its own), so 4 are made here.

Followed as fast_align computes it, where it differs from the mathematics: the model
al-feat divides by Z_j with m and n swapped, and with its unsigned arithmetic (da.h's
ComputeDLogZ calls ComputeZ(j, n, m); :func:`expected_feature`), and the posterior
al-feat measures j from 0 where the prior measures it from 1. Both move the tension
(Multi30k en-de's first goes to 6.16 as fast_align's does, to 5.96 with the exact
expectation) and with it the links; kept, the tensions and log-likelihoods are fast_align's
to their 6 printed digits, and the links differ from the fast_align binary's on 6 of
Multi30k's 29,000 lines (two runs of the binary differ on 7; ``tests/test_fastalign_em.py``).

Every core, one model. fast_align's C++ adds each posterior to one hash table from OpenMP
threads ("Ignore race conditions here", its ttables.h), so that its model changes from run
to run. Here the corpus is read :data:`CHUNK_PAIRS` pairs at a time and cut into chunks of
about :data:`CHUNK_CELLS` cells (a cell being a target word's source word or NULL),
whatever the number of workers. A worker computes a chunk's posteriors and sums them per
word pair of the chunk in the chunk's order (E-step); then each worker takes a range of the
table's rows, adds the chunks' sums into it in chunk order and normalizes its rows
(M-step). Every count is thus summed in one order for any number of workers: the model is
the same for every number, on every run.

Memory and disk. The table holds every word pair that meets in a pair of the corpus, and
NULL with every target word, in one sorted array of keys ``e * 2**32 + f`` (8 bytes an entry)
kept in this process and shared with the forked workers, and one of t(f|e) in double
precision as fast_align holds it (8 more), in a file of the work folder that the workers
read and write through the page cache. Each chunk leaves in the work folder, for the passes,
where its word pairs are in the table (4 bytes per cell, plus 4 or 8 per distinct word pair
of the chunk) and, during a pass, its counts (8 bytes per distinct word pair): a few GiB of
disk for 1,000,000 pairs of 25 words a side, removed at the end. A worker holds one chunk's
arrays at a time: some tens of values per cell.
"""
import functools
import itertools
import logging
import os
import resource
import shutil
import tempfile
from typing import Iterable, List, NamedTuple, Tuple

import numpy as np

from ..runtime.parallel import LineChunk, line_chunks, read_chunk
from ..runtime.progress import Progress
from ..runtime.pool import map_batches

logger = logging.getLogger(__name__)

SEPARATOR = "|||"
NULL = "<eps>"  # fast_align's NULL word: id 1 here, the first in the vocabulary
PROB_ALIGN_NULL = 0.08  # p0 (fast_align's -p)
INITIAL_TENSION = 4.0  # (-T)
ALPHA = 0.01  # the Dirichlet prior's concentration (-a)
UNINITIALIZED = 1e-9  # t(f|e) in the first pass, before any table (ttables.h)
TENSION_STEPS, TENSION_RATE, MIN_TENSION, MAX_TENSION = 8, 20.0, 0.1, 14.0
PASSES = 4  # of fast_align's 5 iterations, those that update the model
# Pairs a worker reads at a time, and cells (target words times their source words and
# NULL) it then takes at a time: fixed, whatever the workers, so that the order of the sums
# never changes. A worker's E-step holds some tens of arrays of a value per cell of its
# chunk, so the bound on the cells bounds its memory whatever the sentences' lengths.
CHUNK_PAIRS = 1_000
CHUNK_CELLS = 250_000
RANGES_PER_WORKER = 4  # of the table's rows, in the M-step


class Settings(NamedTuple):
    """fast_align's options: -d, -o, -v."""
    favor_diagonal: bool
    optimize_tension: bool
    variational_bayes: bool


class TranslationTable(NamedTuple):
    """t(f|e): word ids (from 1, NULL first) and sorted (e, f) keys, e * 2**32 + f."""
    ids: dict
    keys: np.ndarray
    probs: np.ndarray

    def word_ids(self, words: Iterable[str]) -> np.ndarray:
        """The ids of ``words``; 0 (no entry) for a word the table does not know."""
        return np.fromiter(map(self.ids.get, words, itertools.repeat(0)), dtype=np.int64)

    def probabilities(self, e: np.ndarray, f: np.ndarray, missing: float = 0.0) -> np.ndarray:
        """t(f | e) for arrays of source and target word ids (broadcast); ``missing`` for a
        pair the table lacks: 0 for the corpus it was trained on (it has all of them),
        :data:`.fastalign.UNSEEN_PROBABILITY` for other text. Each distinct pair is looked
        up once, in ascending order: a table of millions of entries is then read in order
        rather than at random (3x faster on 25M entries)."""
        keys, where = np.unique((e << 32) | f, return_inverse=True)  # ascending
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[at] == keys, self.probs[at], missing)[where]


class Chunk(NamedTuple):
    """A chunk's pairs: source and target lengths, their word ids one pair after another."""
    n: np.ndarray
    m: np.ndarray
    source: np.ndarray
    target: np.ndarray


class Cells(NamedTuple):
    """A chunk's target positions ("columns": a pair's j) and, for each, its n source
    positions ("cells"), column after column."""
    pair: np.ndarray  # of each column: its pair, the pair's lengths and its j (from 1)
    n: np.ndarray
    m: np.ndarray
    j: np.ndarray
    column: np.ndarray  # of each cell: its column and its i (from 1)
    i: np.ndarray
    starts: np.ndarray  # each column's first cell


def pieces(chunk: Chunk, cells: int) -> List[Chunk]:
    """``chunk`` cut into chunks of about ``cells`` cells at most: each holds the pairs whose
    first cell falls in one multiple of ``cells`` of ``chunk``'s cells, so it ends within
    its last pair's cells past the bound."""
    sizes = chunk.m.astype(np.int64) * (chunk.n.astype(np.int64) + 1)
    multiple = (np.cumsum(sizes) - sizes) // cells  # that each pair's first cell falls in
    cuts = np.flatnonzero(np.diff(multiple)) + 1
    source_cuts = np.cumsum(chunk.n.astype(np.int64))[cuts - 1]
    target_cuts = np.cumsum(chunk.m.astype(np.int64))[cuts - 1]
    return [Chunk(n, m, source, target) for n, m, source, target in zip(
        np.split(chunk.n, cuts), np.split(chunk.m, cuts), np.split(chunk.source, source_cuts),
        np.split(chunk.target, target_cuts))]


def cells_of(chunk: Chunk) -> Cells:
    pair = np.repeat(np.arange(len(chunk.m)), chunk.m)
    j = np.arange(len(pair)) - np.repeat(np.cumsum(chunk.m) - chunk.m, chunk.m) + 1
    n, m = chunk.n[pair].astype(np.int64), chunk.m[pair].astype(np.int64)
    column = np.repeat(np.arange(len(pair)), n)
    starts = np.cumsum(n) - n
    return Cells(pair, n, m, j, column, np.arange(len(column)) - starts[column] + 1, starts)


# The diagonal prior (fast_align's da.h), vectorized: j a target position of m (from 1), i a
# source position of n, all arrays of the same shape or scalars.

def feature(j, i, m, n):
    return -np.abs(i / n - j / m)


def unnormalized(j, i, m, n, tension):
    return np.exp(feature(j, i, m, n) * tension)


def _series_parts(j, m, n, tension) -> tuple:
    """da.h's two geometric series over i, from j's point on the diagonal (j n / m) up to n
    and down to 1: (ceil, floor, ratio, num_top, top, bottom), ``top`` and ``bottom`` the
    first terms. ``num_top`` wraps around as da.h's unsigned int does where j n / m > n
    (only in :func:`expected_feature`'s call)."""
    floor = (j * n / m).astype(np.int64)  # double(j) * n / m, truncated
    ratio = np.exp(-tension / n)
    num_top = (n - floor) % 2 ** 32
    top = unnormalized(j, floor + 1, m, n, tension)
    bottom = unnormalized(j, floor, m, n, tension)
    return floor + 1, floor, ratio, num_top, top, bottom


def normalizer(j, m, n, tension):
    """Z_j = the sum over i = 1..n of exp(-tension |i/n - j/m|) (da.h's ComputeZ)."""
    _, floor, ratio, num_top, top, bottom = _series_parts(j, m, n, tension)
    return np.where(num_top != 0, top * (1.0 - ratio ** num_top.astype(np.float64)), 0.0) / \
        (1.0 - ratio) + np.where(floor != 0, bottom * (1.0 - ratio ** floor), 0.0) / (1.0 - ratio)


def diagonal_prior(j, m, n, column, i, tension):
    """The prior of each cell (its column and its i) of columns (j, m, n) (-d):
    (1 - p0) * exp(-tension |i/n - j/m|) / Z_j, Z_j computed once a column."""
    z = normalizer(j, m, n, tension) / (1 - PROB_ALIGN_NULL)
    return unnormalized(j[column], i, m[column], n[column], tension) / z[column]


def _series(a_1, g_1, r, d, count):
    """The sum over k = 0..count-1 of (a_1 + k d) g_1 r^k (da.h's arithmetico_geometric_series)."""
    g_np1 = g_1 * r ** count
    a_n = d * (count - 1) + a_1
    rm1 = r - 1
    return (a_n * g_np1 - a_1 * g_1) / rm1 - d * (g_np1 - g_1 * r) / (rm1 * rm1)


def expected_feature(j, m, n, tension):
    """The prior's expectation of -|i/n - j/m| over i, as da.h's ComputeDLogZ computes it:
    the sum over i divided by ComputeZ(j, n, m), m and n swapped. fast_align's tension
    follows from this, and is kept here (the exact expectation, divided by Z_j, moves the
    first tension of Multi30k en-de to 5.96 from fast_align's 6.16)."""
    ceil, floor, ratio, num_top, top, bottom = _series_parts(j, m, n, tension)
    d = -1.0 / n
    above = np.where(num_top != 0, _series(feature(j, ceil, m, n), top, ratio, d, num_top), 0.0)
    below = np.where(floor != 0, _series(feature(j, floor, m, n), bottom, ratio, d, floor), 0.0)
    return (above + below) / normalizer(j, n, m, tension)


def digamma(x: np.ndarray) -> np.ndarray:
    """fast_align's digamma (ttables.h's Md::digamma): the recurrence up to 7, then the
    asymptotic series."""
    x = np.array(x, dtype=np.float64)
    result = np.zeros_like(x)
    while (small := x < 7).any():
        result[small] -= 1.0 / x[small]
        x[small] += 1.0
    x -= 0.5
    xx = 1.0 / x
    xx2 = xx * xx
    xx4 = xx2 * xx2
    result += np.log(x) + xx2 / 24.0 - 7.0 / 960.0 * xx4 + 31.0 / 8064.0 * xx4 * xx2 \
        - 127.0 / 30720.0 * xx4 * xx4
    return result


def split_pair(line: str) -> Tuple[list, list]:
    """(source words, target words) of a ``source ||| target`` line (its newline cut off), as
    fast_align reads it: words end at spaces and tabs only."""
    words = [word for word in line.replace("\t", " ").split(" ") if word]
    middle = words.index(SEPARATOR) if SEPARATOR in words else len(words)
    return words[:middle], words[middle + 1:]


def corpus_pair(line: bytes, corpus: str, number: int) -> Tuple[list, list]:
    """:func:`split_pair` of line ``number`` (from 1) of ``corpus``, read with its newline;
    one line that names it (a ValueError) where it is not UTF-8 or a side is empty, where
    fast_align stops too."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{corpus}, line {number}: not valid UTF-8") from None
    source, target = split_pair(text[:-1] if text.endswith("\n") else text)
    if not source or not target:
        raise ValueError(f"{corpus}, line {number}: a side is empty")
    return source, target


# The workers' functions below take ``shared`` first: what :func:`train` has made so far (the
# corpus, the work folder, the settings, the chunks, the table's keys, the tension), the
# pools' shared state, which each pool's workers get with their fork (shared pages, not
# copies: :func:`..runtime.pool.map_batches`).

def _path(shared: dict, index: int, name: str) -> str:
    return os.path.join(shared["workdir"], f"{index:06d}.{name}.npy")


def _read(shared: dict, chunk: LineChunk) -> tuple:
    """A chunk's words (in the order first met) and its pairs in ids of those words."""
    corpus = shared["corpus"]
    words, n, m, source, target = {}, [], [], [], []
    for number, line in enumerate(read_chunk(corpus, chunk, 0), chunk.first):
        src, tgt = corpus_pair(line, corpus, number)
        n.append(len(src))
        m.append(len(tgt))
        source += [words.setdefault(word, len(words)) for word in src]
        target += [words.setdefault(word, len(words)) for word in tgt]
    as_ids = functools.partial(np.array, dtype=np.int32)
    return list(words), Chunk(as_ids(n), as_ids(m), as_ids(source), as_ids(target))


def _word_pairs(shared: dict, index: int) -> None:
    """A chunk's distinct word pairs, sorted, to its ``distinct`` file; where each column's
    NULL pair and then each cell's pair is among them to its ``where`` file."""
    chunk = shared["chunks"][index]
    cells = cells_of(chunk)
    first_source = np.cumsum(chunk.n.astype(np.int64)) - chunk.n
    f = chunk.target.astype(np.int64)
    e = chunk.source[first_source[cells.pair][cells.column] + cells.i - 1].astype(np.int64)
    distinct, where = np.unique(np.concatenate([(1 << 32) | f, (e << 32) | f[cells.column]]),
                                return_inverse=True)
    np.save(_path(shared, index, "where"), where.astype(np.int32))
    np.save(_path(shared, index, "distinct"), distinct)


def _merged(runs: List[np.ndarray]) -> np.ndarray:
    """The distinct keys of the sorted arrays ``runs``, sorted: a stable sort merges the runs
    (numpy's default sort took 26 times as long on 8 runs of 2.5M keys)."""
    keys = np.concatenate(runs)
    keys.sort(kind="stable")
    return keys[np.append(True, keys[1:] != keys[:-1])]


def _place(shared: dict, index: int) -> None:
    """A chunk's distinct word pairs' entries in the table, ascending, to its ``at`` file."""
    keys = shared["keys"]
    at = np.searchsorted(keys, np.load(_path(shared, index, "distinct")))
    np.save(_path(shared, index, "at"), at.astype(np.min_scalar_type(len(keys))))
    os.remove(_path(shared, index, "distinct"))


def _probs(shared: dict, mode: str) -> np.ndarray:
    """t(f|e), in the work folder's ``probs.npy``."""
    return np.load(os.path.join(shared["workdir"], "probs.npy"), mmap_mode=mode)


def _expect(shared: dict, index: int) -> tuple:
    """The E-step on a chunk: its expected counts, summed per distinct word pair in the
    chunk's order, to its ``counts`` file; (NULL's posterior mass, the posterior al-feat,
    the log-likelihood)."""
    cells, settings = cells_of(shared["chunks"][index]), shared["settings"]
    at, where = np.load(_path(shared, index, "at")), np.load(_path(shared, index, "where"))
    t = _probs(shared, "r")[at] if shared["trained"] else np.full(len(at), UNINITIALIZED)
    columns = len(cells.j)
    if settings.favor_diagonal:
        prior = diagonal_prior(cells.j, cells.m, cells.n, cells.column, cells.i, shared["tension"])
        null = t[where[:columns]] * PROB_ALIGN_NULL
    else:
        prior = 1.0 / (cells.n[cells.column] + 1)
        null = t[where[:columns]] / (cells.n + 1)
    scores = t[where[columns:]] * prior
    total = null + np.add.reduceat(scores, cells.starts)
    posterior = scores / total[cells.column]
    np.save(_path(shared, index, "counts"), np.bincount(
        where, weights=np.concatenate([null / total, posterior]), minlength=len(at)))
    # fast_align's posterior al-feat takes j from 0 (its loop index), the prior from 1
    al_feat = feature(cells.j[cells.column] - 1, cells.i, cells.m[cells.column],
                      cells.n[cells.column])
    return (null / total).sum(), (al_feat * posterior).sum(), np.log(total).sum()


def _maximize(shared: dict, rows: Tuple[int, int]) -> None:
    """The M-step on a range of the table's rows (entries ``rows[0]`` to ``rows[1]``): the
    chunks' counts added in chunk order, then t(f|e) row by row."""
    low, high = rows
    counts = np.zeros(high - low)
    for index in range(len(shared["chunks"])):
        at = np.load(_path(shared, index, "at"), mmap_mode="r")
        first, last = np.searchsorted(at, [low, high])
        counts[at[first:last] - low] += np.load(_path(shared, index, "counts"), mmap_mode="r")[first:last]
    keys = shared["keys"][low:high]
    starts = np.flatnonzero(np.diff(keys >> 32, prepend=-1))
    length = np.diff(np.append(starts, len(keys)))
    if shared["settings"].variational_bayes:
        total = np.add.reduceat(counts + ALPHA, starts)
        total[total == 0] = 1
        probs = np.exp(digamma(counts + ALPHA) - np.repeat(digamma(total), length))
    else:
        total = np.add.reduceat(counts, starts)
        total[total == 0] = 1
        probs = counts / np.repeat(total, length)
    _probs(shared, "r+")[low:high] = probs


def _row_ranges(keys: np.ndarray, count: int) -> List[Tuple[int, int]]:
    """``count`` ranges of about as many entries of the table, each whole rows."""
    rows = np.flatnonzero(np.diff(keys >> 32, prepend=-1))
    cuts = np.unique(rows[np.searchsorted(rows, np.linspace(0, len(keys), count + 1)[1:-1])])
    bounds = [0, *cuts.tolist(), len(keys)]
    return [(low, high) for low, high in zip(bounds, bounds[1:]) if high > low]


def _optimize_tension(tension: float, al_feat: float, lengths: np.ndarray, tokens: int) -> float:
    """fast_align's 8 gradient steps on the tension, towards the posterior al-feat.
    ``lengths``: the distinct (m, n) of the corpus' pairs and how many pairs have each."""
    m, n, count = lengths.T
    j = np.concatenate([np.arange(1, size + 1) for size in m])
    m_j, n_j, count_j = (np.repeat(a, m) for a in (m, n, count))
    for _ in range(TENSION_STEPS):
        model = (count_j * expected_feature(j, m_j, n_j, tension)).sum() / tokens
        tension = min(max(tension + (al_feat - model) * TENSION_RATE, MIN_TENSION), MAX_TENSION)
    return tension


def _cpu_seconds() -> float:
    """The CPU time of this process and of its children that have ended (the workers of
    each pool, which ends with its map)."""
    return sum(usage.ru_utime + usage.ru_stime for usage in
               map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def train(corpus: str, workdir: str, settings: Settings, workers: int = 1) -> tuple:
    """fast_align's model of ``corpus`` (``source ||| target`` lines), trained by ``workers``
    processes, in a folder of its own in ``workdir``, removed at the end: (its
    :class:`TranslationTable`, its final tension). A ValueError names a line fast_align
    would stop at (see :func:`corpus_pair`). Its wall time and the CPU time of all its
    processes are logged at its end (``bench.scaling`` reads them)."""
    cpu = _cpu_seconds()
    (total,), chunks = line_chunks([corpus], CHUNK_PAIRS)
    progress = Progress("train fast_align's model", (PASSES + 2) * total, unit="pair passes",
                        log=logger)
    workdir = tempfile.mkdtemp(prefix="fastalign-em-", dir=workdir)
    shared = dict(corpus=corpus, workdir=workdir, settings=settings, trained=False,
                  tension=INITIAL_TENSION)
    try:
        ids, read = {NULL: 1}, []
        for words, chunk in map_batches(_read, chunks, workers, shared):
            local = np.fromiter((ids.setdefault(word, len(ids) + 1) for word in words),
                                dtype=np.int32, count=len(words))
            read += pieces(chunk._replace(source=local[chunk.source], target=local[chunk.target]),
                           CHUNK_CELLS)
            progress.update(len(chunk.m))
        shared["chunks"] = read

        keys, pending = np.zeros(0, dtype=np.int64), []
        for index, _ in enumerate(map_batches(_word_pairs, range(len(read)), workers, shared)):
            pending.append(np.load(_path(shared, index, "distinct")))
            if sum(map(len, pending)) > len(keys) + (1 << 24):
                keys, pending = _merged([keys, *pending]), []
            progress.update(len(read[index].m))
        shared["keys"] = keys = _merged([keys, *pending])
        del pending
        list(map_batches(_place, range(len(read)), workers, shared))
        np.lib.format.open_memmap(os.path.join(workdir, "probs.npy"), "w+", np.float64,
                                  (len(keys),))
        ranges = _row_ranges(keys, RANGES_PER_WORKER * workers)
        m, n = (np.concatenate([getattr(chunk, side) for chunk in read]).astype(np.int64)
                for side in ("m", "n"))
        shapes, count = np.unique(np.stack([m, n], axis=1), axis=0, return_counts=True)
        lengths, tokens = np.column_stack([shapes, count]), int(m.sum())
        logger.info("train fast_align's model: %d pairs, %d words, %d word pairs", total,
                    len(ids), len(keys))

        for number in range(1, PASSES + 1):
            null_mass = al_feat = likelihood = 0.0
            sums = map_batches(_expect, range(len(read)), workers, shared)
            for index, (c0, feat, loglik) in enumerate(sums):
                null_mass, al_feat, likelihood = null_mass + c0, al_feat + feat, likelihood + loglik
                progress.update(len(read[index].m))
            al_feat /= tokens
            message = (f"train fast_align's model: iteration {number}: log_e likelihood "
                       f"{likelihood:g}, posterior p0 {null_mass / tokens:g}, posterior "
                       f"al-feat {al_feat:g}")
            if settings.favor_diagonal and settings.optimize_tension and number > 1:
                shared["tension"] = _optimize_tension(shared["tension"], al_feat, lengths, tokens)
                message += f", final tension {shared['tension']:g}"
            logger.info(message)
            list(map_batches(_maximize, ranges, workers, shared))
            shared["trained"] = True
        progress.finish(always=True)  # bench.scaling reads the training's time from it
        logger.info("train fast_align's model: %.1f CPU seconds", _cpu_seconds() - cpu)
        return TranslationTable(ids, keys, np.array(_probs(shared, "r"))), shared["tension"]
    finally:
        shutil.rmtree(workdir)
