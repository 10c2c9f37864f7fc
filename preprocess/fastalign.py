"""``python -m convs2s_preprocess.fastalign -i CORPUS -d -o -v``: fast_align without its binary.

Writes what ``fast_align -i CORPUS -d -o -v`` writes (Dyer et al., 2013; the Lua fairseq
builds the paper's dictionary from it): the forward alignment of each ``source ||| target``
line, as Pharaoh ``i-j`` links on stdout. ``convs2s-align-dict`` runs it, as a separate
process, when no ``fast_align`` binary is installed (none is on PyPI).

The model comes from systran-align (PyPI), fast_align's C++ code as a Python library: its
``generate_alignment_probabilities`` runs fast_align's EM training (both directions) and
writes each direction's translation table t(f|e). The library's own ``Aligner`` is not
used: it returns only the grow-diag-final-and symmetrization of both directions, decoded
with the default diagonal tension instead of the optimized one, and its dictionary agrees
with the binary's on only 93% of source-word occurrences (Multi30k). This module takes
fast_align's own final decision instead, from the forward table and the tension the
training reached: target word j (1-based) of a pair with m target and n source words goes
to the source position i that maximizes

    t(f_j | e_i) * (1 - p0) * exp(-tension * |i/n - j/m|) / Z_j      (-d: favour the diagonal)

or to NULL (no link) when t(f_j | NULL) * p0 is at least as large; Z_j normalizes the
diagonal prior over i, p0 = 0.08. Without -d the prior is uniform over NULL and the n
source words. On Multi30k en-de (29,000 pairs) the links differ from the binary's on 7
lines (as many as two runs of the binary differ from each other), and the dictionary built
from them differs in 2 of 10,357 entries (``tests/test_align.py``; the two words are
those of a pair ``... roped off lap areas . ||| @ @``, whose target word is so improbable
under every source word that single precision, see below, no longer tells them apart).

Reproducible: fast_align adds its counts from several OpenMP threads in whatever order they
come ("Ignore race conditions here", in its ttables.h), so the model changes from run to
run. The library runs here on one thread (``OMP_NUM_THREADS=1`` in the environment of the
process that loads it), which gives the same links on every run.

The tension is read from the library's training log (``final tension:``, six significant
digits), as fast_align's own ``force_align.py`` reads it. The translation tables are read
from the library's binary files (format version 2 of systran-align 3.5.0: the vocabulary,
then one row per source word e of (f, t(f|e)) pairs), written without pruning. They hold
t(f|e) in single precision, and leave out the pairs whose probability underflowed to 0;
otherwise every co-occurring word pair is there, about 8 bytes each: a corpus of millions
of pairs needs gigabytes of memory, as the binary does. The table is read through a
memory map into sorted keys and probabilities, 12 bytes an entry (:func:`read_table`).

Only the forward direction is trained: the library's API trains both, one after the
other, so it runs in a child process that is stopped once its log shows the forward table
written (:func:`train`; the backward half was about 40% of the time). Decoding is per
pair, so ``--workers N`` decodes chunks of the corpus in N processes forked after the table
is read, which share it: each reads its chunk of the file itself and writes its links to a
part file that this process appends to the output (:func:`.parallel.map_chunks_into`), so
that this process is not the one every line passes through. A worker decodes a few thousand
pairs at a time in one numpy computation (:func:`forward_links`), looking each distinct word
pair up once, in order.

``--sample N`` trains on N pairs spread evenly over the corpus (every k-th, no randomness)
and decodes every pair with that model, as ``fast_align -f TABLE`` aligns text it was not
trained on: a word pair the table lacks gets fast_align's probability of a missing entry,
1e-9 (its ``ttables.h``), instead of 0. The table, the training's time and its memory then
grow with N, not with the corpus; decoding still reads every pair, on every worker. A word
absent from the sample is seldom linked, so the dictionary loses rare words first: how
many, against the full training, is measured by ``python -m bench.sampling`` (the
performance page), which chose ``convs2s-align-dict``'s default.
"""
import argparse
import functools
import gc
import itertools
import logging
import mmap
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from typing import Iterable, NamedTuple

import numpy as np

from .parallel import LineChunk, line_chunks, map_chunks_into, read_chunk
from .processes import die_with_parent
from .progress import Progress
from .textio import count_lines, spread_evenly

logger = logging.getLogger(__name__)

SEPARATOR = "|||"
NULL = "<eps>"  # fast_align's NULL word, first in the vocabulary
PROB_ALIGN_NULL = 0.08  # fast_align's p0 (its -p option, not changed here)
INITIAL_TENSION = 4.0  # fast_align's starting diagonal tension (-T)
# beam_threshold of the library's table export: a row keeps the entries with log t(f|e) >=
# -log(max_f t(f|e)) * beam_threshold, so a huge negative value keeps them all.
KEEP_ALL = -1e300
FORMAT_VERSION = 2
ENTRY = np.dtype([("f", "<i4"), ("p", "<f4")])
# The library's training of the forward direction: an initial pass and 5 EM iterations
# over the corpus; its log has a dot per DOT_PAIRS pairs of each pass.
TRAINING_PASSES = 6
DOT_PAIRS = 1000
CHECK_SECONDS = 0.1  # between two looks at the training's log
# Pairs handed to a decoding worker at a time, and the most scores (t(f|e) times a prior)
# it computes at once: some 100 MB of arrays.
DECODE_CHUNK_LINES = 20_000
DECODE_SCORES = 1_000_000
# fast_align's t(f|e) for a pair its table lacks (ttables.h), used when the model was
# trained on a sample: the pairs that never met in the sample.
UNSEEN_PROBABILITY = 1e-9


class Settings(NamedTuple):
    """fast_align's options: -d, -o, -v."""
    favor_diagonal: bool
    optimize_tension: bool
    variational_bayes: bool


class TranslationTable(NamedTuple):
    """t(f|e) of one direction: word ids (1-based, as in the file) and sorted (e, f) keys."""
    ids: dict
    keys: np.ndarray  # e * 2**32 + f, ascending
    probs: np.ndarray

    def word_ids(self, words: Iterable[str]) -> np.ndarray:
        """The ids of ``words``; 0 (no entry) for a word the table does not know."""
        return np.fromiter(map(self.ids.get, words, itertools.repeat(0)), dtype=np.int64)

    def probabilities(self, e: np.ndarray, f: np.ndarray, missing: float = 0.0) -> np.ndarray:
        """t(f | e) for arrays of source and target word ids (broadcast); ``missing`` for a
        pair the table lacks: 0 for the corpus it was trained on (the export leaves out the
        pairs whose probability underflowed to 0), :data:`UNSEEN_PROBABILITY` for other text.
        Each distinct pair is looked up once, in ascending order: a table of millions of
        entries is then read in order rather than at random (3x faster on 25M entries)."""
        keys, where = np.unique((e << 32) | f, return_inverse=True)  # ascending
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[at] == keys, self.probs[at], missing)[where]


def trained_pairs(log: str) -> int:
    """Pair passes done by the library's training, from its log: a dot per
    :data:`DOT_PAIRS` pairs of each pass over the corpus, on lines of their own, which
    end in ``[PAIRS]`` once they hold 50 dots."""
    marks = r"(?m)^(\.+)(?: \[?\d*\]?)?$"  # the last line may be read half written
    return DOT_PAIRS * sum(len(run) for run in re.findall(marks, log + "\n"))


def forward_written(log: str, forward: str) -> bool:
    """Whether the library's log shows the forward table written: the table announced and
    the backward direction's first pass begun after it (the library trains and writes one
    direction, then the other)."""
    marker = f"conditional probabilities: {forward}"
    return marker in log and "INITIAL PASS" in log[log.index(marker):]


def library_training(corpus: str, forward: str, backward: str, settings: list) -> None:
    """The library's training of both directions, in the child process :func:`train` starts."""
    import systran_align
    favor_diagonal, optimize_tension, variational_bayes = settings
    systran_align.generate_alignment_probabilities(
        corpus, forward, backward, verbose=True, favor_diagonal=favor_diagonal,
        optimize_tension=optimize_tension, variational_bayes=variational_bayes,
        beam_threshold=KEEP_ALL)


def train(corpus: str, workdir: str, settings: Settings) -> tuple:
    """fast_align's EM on ``corpus``: (forward table file, final diagonal tension).

    The library runs in a child process on one thread (``OMP_NUM_THREADS=1``, read when
    it loads), which logs to a file; that log gives the progress, and once it shows the
    forward table written the child is stopped: the backward direction, which the
    library's API trains too, is never read.
    """
    forward, backward, log = (os.path.join(workdir, name)
                              for name in ("forward.probs", "backward.probs", "train.log"))
    progress = Progress("train fast_align's model", TRAINING_PASSES * count_lines(corpus),
                        unit="pair passes", log=logger)
    code = (f"from {__package__}.fastalign import library_training; "
            f"library_training(*{[corpus, forward, backward, list(settings)]!r})")
    with open(log, "w") as log_file:
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=log_file,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"),
                                 preexec_fn=die_with_parent())
        try:
            while child.poll() is None:
                time.sleep(CHECK_SECONDS)
                with open(log, errors="replace") as f:
                    text = f.read()
                progress.update(min(trained_pairs(text), progress.total) - progress.done)
                if forward_written(text, forward):
                    break
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
    with open(log, errors="replace") as f:
        text = f.read()
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    if not forward_written(text, forward) and child.returncode != 0:
        raise RuntimeError(f"systran-align's training failed (exit status {child.returncode})")
    marker = f"conditional probabilities: {forward}"
    if marker not in text:
        raise RuntimeError(f"systran-align's training log lacks {marker!r}")
    progress.update(progress.total - progress.done)  # every pass is done (the dots are rounded)
    progress.finish()
    tensions = re.findall(r"final tension: (\S+)", text[:text.index(marker)])
    return forward, float(tensions[-1]) if tensions else INITIAL_TENSION


def read_table(path: str) -> TranslationTable:
    """The translation table systran-align wrote to ``path``.

    The file is mapped, not read: the vocabulary is decoded from the mapping and the rows
    are viewed in place, as one array of 8-byte records (a row's header, its source word and
    length, is one record like the (f, p) entries after it). Only the sorted keys and
    probabilities are built, about 12 bytes an entry (the sort needs 16 more for a moment).
    """
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    version, size = struct.unpack_from("<ii", data)
    if version != FORMAT_VERSION:
        raise RuntimeError(f"{path}: systran-align table format {version}, expected "
                           f"{FORMAT_VERSION} (install systran-align 3.5.0)")
    ids, offset = {}, 8
    for number in range(1, size + 1):
        end = data.find(b"\0", offset)
        ids[data[offset:end].decode("utf-8")] = number
        offset = end + 1
    records = np.frombuffer(data, dtype=ENTRY, offset=offset + 4)  # after the table's size
    header_at, row = [], 0
    while row < len(records):  # one step per source word
        header_at.append(row)
        row += 1 + int(records["p"][row:row + 1].view("<i4")[0])
    header_at = np.array(header_at, dtype=np.int64)
    lengths = np.diff(np.append(header_at, len(records)))
    keys = np.repeat(records["f"][header_at].astype(np.int64) << 32, lengths)
    keys |= records["f"]
    keys[header_at] = -1  # the headers sort first, and are cut off
    order = np.argsort(keys, kind="stable")[len(header_at):]
    table = TranslationTable(ids, keys[order], records["p"][order])
    del records
    data.close()
    return table


@functools.lru_cache(maxsize=2048)  # the frequent pairs of lengths; some 30 MB at most
def alignment_prior(n: int, m: int, tension: float, favor_diagonal: bool) -> tuple:
    """(prior of source position i for target position j, for j = 1..m and then i = 1..n,
    as one array; prior of NULL); the same for every pair of these lengths, so kept for
    the frequent ones. Without -d both are 1/(n+1), in single precision (the precision
    that fast_align's t(f|e) multiplies them in)."""
    if not favor_diagonal:
        return np.full(n * m, 1.0 / (n + 1), dtype=np.float32), np.float32(1.0 / (n + 1))
    i = np.arange(1, n + 1)[:, None] / n
    j = np.arange(1, m + 1)[None, :] / m
    prior = np.exp(-tension * np.abs(i - j))
    prior *= (1 - PROB_ALIGN_NULL) / prior.sum(axis=0)
    prior = prior.T.ravel()
    prior.flags.writeable = False
    return prior, PROB_ALIGN_NULL


def forward_links(pairs: list, table: TranslationTable, tension: float, settings: Settings,
                  missing: float = 0.0) -> list:
    """fast_align's forward alignment of each (source words, target words) of ``pairs``
    (see the module docstring), as Pharaoh links; ``missing``: see
    :meth:`TranslationTable.probabilities`.

    The pairs are decoded together: the scores of every target position ("column": a pair
    and its j) against NULL and every source position lie in one array, column after
    column, and a column's link is its first maximum, as fast_align's strict '>' keeps it.
    """
    n = np.array([len(source) for source, _ in pairs])
    m = np.array([len(target) for _, target in pairs])
    pair = np.repeat(np.arange(len(pairs)), m)  # the pair of each column
    j = np.arange(len(pair)) - np.repeat(np.cumsum(m) - m, m)  # its target position, from 0
    rows = n[pair] + 1  # a column scores NULL (i = 0) and then the n source words
    column = np.repeat(np.arange(len(pair)), rows)  # the column of each score
    i = np.arange(len(column)) - np.repeat(np.cumsum(rows) - rows, rows)
    e = table.word_ids(word for source, _ in pairs for word in (NULL, *source))
    f = table.word_ids(word for _, target in pairs for word in target)
    null_in_e = (np.cumsum(n + 1) - (n + 1))[pair]
    t = table.probabilities(e[null_in_e[column] + i], f[column], missing)
    priors = [alignment_prior(a, b, tension, settings.favor_diagonal)
              for a, b in zip(n.tolist(), m.tolist())]
    null_prior = priors[0][1] if settings.favor_diagonal else np.array([p for _, p in priors])[pair]
    scores = t[i > 0] * np.concatenate([prior for prior, _ in priors])
    word_column = column[i > 0]
    starts = np.cumsum(rows - 1) - (rows - 1)  # each column's first score in scores
    best_score = np.maximum.reduceat(scores, starts)
    hits = np.flatnonzero(scores == best_score[word_column])
    first = np.ones(len(hits), dtype=bool)  # the first maximum of each column
    first[1:] = word_column[hits[1:]] != word_column[hits[:-1]]
    best = hits[first] - starts
    linked = np.flatnonzero(best_score > t[i == 0] * null_prior)
    links = [[] for _ in pairs]
    for p, i, k in zip(pair[linked].tolist(), best[linked].tolist(), j[linked].tolist()):
        links[p].append(f"{i}-{k}")
    return [" ".join(line) for line in links]


def split_pair(line: str) -> tuple:
    """(source tokens, target tokens) of a ``source ||| target`` line, as fast_align reads it."""
    tokens = line.split()
    middle = tokens.index(SEPARATOR) if SEPARATOR in tokens else len(tokens)
    return tokens[:middle], tokens[middle + 1:]


# What the decoding workers read, set before they are forked (and so shared, not copied).
_decoder = {}


def _decode_chunk(chunk: LineChunk, parts: list) -> None:
    """Write the links of the corpus' ``chunk`` to ``parts[0]``, decoding at most
    :data:`DECODE_SCORES` scores at a time (one pair, whatever its size, for a long pair)."""
    with open(parts[0], "w", encoding="utf-8", newline="\n") as out:
        def decode(pairs: list) -> None:
            out.write("".join(links + "\n" for links in forward_links(pairs, **_decoder["model"])))

        pairs, scores = [], 0
        for number, line in enumerate(read_chunk(_decoder["corpus"], chunk, 0), chunk.first):
            source, target = split_pair(line.decode("utf-8"))
            if not source or not target:
                raise ValueError(f"{_decoder['corpus']}, line {number}: a side is empty")
            if pairs and scores + (len(source) + 1) * len(target) > DECODE_SCORES:
                decode(pairs)
                pairs, scores = [], 0
            pairs.append((source, target))
            scores += (len(source) + 1) * len(target)
        if pairs:
            decode(pairs)


def align(corpus: str, settings: Settings, out, workers: int = 1, sample: int = 0) -> None:
    """Write the forward links of every line of ``corpus`` to ``out`` (a binary file); the
    lines are decoded in ``workers`` processes (the training is on one thread whatever
    ``workers`` is, so the links are the same for any number). ``sample``: train on this many
    pairs (see the module docstring); 0, or a number no smaller than the corpus, trains on
    every pair."""
    (total,), chunks = line_chunks([corpus], DECODE_CHUNK_LINES)
    with tempfile.TemporaryDirectory(prefix="fastalign-") as workdir:
        training, missing = corpus, 0.0
        if 0 < sample < total:
            logger.info("training fast_align's model on %d of the %d pairs, spread evenly "
                        "(--sample); aligning every pair with it", sample, total)
            training, missing = os.path.join(workdir, "sample"), UNSEEN_PROBABILITY
            with open(corpus, "rb") as lines, open(training, "wb") as kept:
                kept.writelines(spread_evenly(lines, sample, total))
        table_path, tension = train(training, workdir, settings)
        table = read_table(table_path)
        os.remove(table_path)
        _decoder.update(corpus=corpus, model=dict(table=table, tension=tension,
                                                  settings=settings, missing=missing))
        gc.freeze()  # the table's objects stay shared with the workers: no collection writes them
        progress = Progress("align", total, unit="pairs", log=logger)
        try:
            for chunk, _ in map_chunks_into(_decode_chunk, chunks, [out],
                                            os.path.join(workdir, "parts"), workers):
                progress.update(chunk.lines)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        progress.finish()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m convs2s_preprocess.fastalign",
        description="fast_align's forward alignment (Pharaoh links on stdout), from the "
                    "systran-align library")
    parser.add_argument("-i", dest="input", required=True, help="source ||| target lines")
    parser.add_argument("-d", dest="favor_diagonal", action="store_true",
                        help="favour alignment points close to the diagonal")
    parser.add_argument("-o", dest="optimize_tension", action="store_true",
                        help="optimize how close to the diagonal they should be")
    parser.add_argument("-v", dest="variational_bayes", action="store_true",
                        help="Dirichlet prior on the translation tables")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes that decode (the training is on one thread)")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="train on N pairs spread evenly over the corpus, then align "
                             "every pair (default 0: train on every pair)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s")
    settings = Settings(args.favor_diagonal, args.optimize_tension, args.variational_bayes)
    align(args.input, settings, sys.stdout.buffer, args.workers, args.sample)


if __name__ == "__main__":
    main()
