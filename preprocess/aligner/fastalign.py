"""``python -m convs2s_preprocess.aligner.fastalign -i CORPUS -d -o -v``: fast_align without its binary.

Writes what ``fast_align -i CORPUS -d -o -v`` writes (Dyer et al., 2013; the Lua fairseq
builds the paper's dictionary from it): the forward alignment of each ``source ||| target``
line, as Pharaoh ``i-j`` links on stdout. ``convs2s-align-dict`` runs it, as a separate
process, unless a ``fast_align`` binary is installed (none is on PyPI).

The model is fast_align's, trained by :mod:`.fastalign_em` in ``--workers`` processes (the
same model for any number of them). The links are fast_align's own final decision: target
word j (1-based) of a pair with m target and n source words goes to the source position i
that maximizes

    t(f_j | e_i) * (1 - p0) * exp(-tension * |i/n - j/m|) / Z_j      (-d: favour the diagonal)

or to NULL (no link) when t(f_j | NULL) * p0 is at least as large; Z_j normalizes the
diagonal prior over i, p0 = 0.08. Without -d the prior is uniform over NULL and the n
source words. As in fast_align, in double precision, and the first of equal scores wins. On
Multi30k en-de (29,000 pairs) the links differ from the binary's on 6 lines, fewer than two
runs of the binary differ from each other (``tests/test_fastalign_em.py``).

Decoding is per pair, so ``--workers N`` also decodes chunks of the corpus in N processes
forked after training, which share the table: each reads its chunk of the file itself and
writes its links to a part file that this process appends to the output
(:func:`..runtime.parallel.map_chunks_into`), so that this process is not the one every line passes
through. A worker decodes a few hundred pairs at a time in one numpy computation
(:func:`forward_links`), looking each distinct word pair up once, in order.

``--sample N`` trains on N pairs spread evenly over the corpus (every k-th, no randomness)
and decodes every pair with that model, as ``fast_align -f TABLE`` aligns text it was not
trained on: a word pair the table lacks gets fast_align's probability of a missing entry,
1e-9 (its ``ttables.h``), instead of 0. The table, the training's time and its memory then
grow with N, not with the corpus; decoding still reads every pair, on every worker. A word
absent from the sample is seldom linked, so the dictionary loses rare words first: how
many, against the full training, is measured by ``python -m bench.sampling`` (the
performance page), which chose ``convs2s-align-dict``'s default.

``--keep DIR`` makes a killed run resumable (``convs2s-align-dict`` keeps DIR in its step's
shard folder): the trained model is saved in DIR, and the links are decoded in shards of
:func:`..runtime.shards.shard_lines` pairs (:mod:`..runtime.shards`), each kept in DIR once complete. A rerun
on the same corpus (its sha256) with the same options loads the model instead of training
and decodes only the shards not yet done; anything else discards DIR's contents.
"""
import argparse
import functools
import gc
import json
import logging
import os
import sys
import tempfile
from typing import Optional

import numpy as np

from ..runtime.atomic import atomic_outputs, fingerprint
from .fastalign_em import (NULL, PROB_ALIGN_NULL, Settings, TranslationTable, corpus_pair,
                           diagonal_prior, train)
from ..runtime.parallel import LineChunk, line_chunks, map_chunks_into, read_chunk
from ..runtime.progress import Progress
from ..runtime.shards import Shards, shard_lines
from ..textio import spread_evenly

logger = logging.getLogger(__name__)

# Pairs handed to a decoding worker at a time, and the most scores (t(f|e) times a prior)
# it computes at once: some 25 MB of arrays. A worker's memory follows this bound (measured
# on 300,000 built pairs, 8 workers: 142 MiB a worker at 1,000,000 scores, 72 at 250,000, 58
# at 100,000), its speed does not (10,200 pairs/s on 2 workers at 250,000, 9,500 at
# 1,000,000, with a table of 19M entries).
DECODE_CHUNK_LINES = 20_000
DECODE_SCORES = 250_000
# fast_align's t(f|e) for a pair its table lacks (ttables.h), used when the model was
# trained on a sample: the pairs that never met in the sample.
UNSEEN_PROBABILITY = 1e-9


@functools.lru_cache(maxsize=2048)  # the frequent pairs of lengths; some 30 MB at most
def alignment_prior(n: int, m: int, tension: float, favor_diagonal: bool) -> tuple:
    """(prior of source position i for target position j, for j = 1..m and then i = 1..n,
    as one array; prior of NULL); the same for every pair of these lengths, so kept for
    the frequent ones. Without -d both are 1/(n+1)."""
    if not favor_diagonal:
        return np.full(n * m, 1.0 / (n + 1)), 1.0 / (n + 1)
    prior = diagonal_prior(np.arange(1, m + 1), np.full(m, m), np.full(m, n),
                           np.repeat(np.arange(m), n), np.tile(np.arange(1, n + 1), m), tension)
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


def _decode_chunk(decoder: dict, chunk: LineChunk, parts: list) -> None:
    """Write the links of the corpus' ``chunk`` to ``parts[0]``, decoding at most
    :data:`DECODE_SCORES` scores at a time (one pair, whatever its size, for a long pair).
    ``decoder``: the corpus and the model, the pool's shared state, which the workers get
    with their fork (shared pages, not copies: :func:`..runtime.pool.map_batches`)."""
    with open(parts[0], "w", encoding="utf-8", newline="\n") as out:
        def decode(pairs: list) -> None:
            out.write("".join(links + "\n" for links in forward_links(pairs, **decoder["model"])))

        pairs, scores = [], 0
        for number, line in enumerate(read_chunk(decoder["corpus"], chunk, 0), chunk.first):
            source, target = corpus_pair(line, decoder["corpus"], number)
            if pairs and scores + (len(source) + 1) * len(target) > DECODE_SCORES:
                decode(pairs)
                pairs, scores = [], 0
            pairs.append((source, target))
            scores += (len(source) + 1) * len(target)
        if pairs:
            decode(pairs)


def save_model(folder: str, table: TranslationTable, tension: float) -> None:
    """Write the trained model to ``folder`` (made atomically): the table's words, one a
    line in the order of their ids, its keys and probabilities, and the final tension."""
    with atomic_outputs([folder]) as (temp,):
        os.makedirs(temp)
        with open(os.path.join(temp, "words.txt"), "w", encoding="utf-8", newline="\n") as f:
            # the words hold no line break: str.split() made them
            f.write("\n".join(sorted(table.ids, key=table.ids.__getitem__)))
        np.save(os.path.join(temp, "keys.npy"), table.keys)
        np.save(os.path.join(temp, "probs.npy"), table.probs)
        with open(os.path.join(temp, "tension.json"), "w", encoding="utf-8") as f:
            json.dump(tension, f)


def load_model(folder: str) -> tuple:
    """(table, tension) that :func:`save_model` wrote to ``folder``."""
    with open(os.path.join(folder, "words.txt"), encoding="utf-8", newline="\n") as f:
        ids = {word: index for index, word in enumerate(f.read().split("\n"), 1)}
    with open(os.path.join(folder, "tension.json"), encoding="utf-8") as f:
        tension = json.load(f)
    return TranslationTable(ids, np.load(os.path.join(folder, "keys.npy")),
                            np.load(os.path.join(folder, "probs.npy"))), tension


def _decode(decoder: dict, chunks: list, out, workdir: str, workers: int,
            progress: Progress) -> None:
    """Write the links of ``chunks`` of ``decoder["corpus"]`` to ``out``, decoded in
    ``workers`` processes with ``decoder["model"]``."""
    for chunk, _ in map_chunks_into(_decode_chunk, chunks, [out], os.path.join(workdir, "parts"),
                                    workers, decoder):
        progress.update(chunk.lines)


def align(corpus: str, settings: Settings, out, workers: int = 1, sample: int = 0,
          keep: Optional[str] = None) -> None:
    """Write the forward links of every line of ``corpus`` to ``out`` (a binary file), the
    model trained and the lines decoded in ``workers`` processes (the links are the same for
    any number). ``sample``: train on this many pairs (see the module docstring); 0, or a
    number no smaller than the corpus, trains on every pair. ``keep``: the folder that makes
    a killed run resumable (the module docstring). A line that fast_align would stop at ends
    the command with one line that names it."""
    chunk_lines = min(DECODE_CHUNK_LINES, shard_lines()) if keep else DECODE_CHUNK_LINES
    (total,), chunks = line_chunks([corpus], chunk_lines)
    shards = None
    if keep:  # shards of whole chunks, each at most shard_lines() pairs
        per_shard = max(1, shard_lines() // chunk_lines)
        groups = [chunks[start:start + per_shard] for start in range(0, len(chunks), per_shard)]
        shards = Shards(keep, {"corpus": fingerprint(corpus)["files"]["."]["sha256"],
                               "settings": settings._asdict(), "sample": sample,
                               "shard_chunks": per_shard, "chunk_lines": chunk_lines},
                        [sum(chunk.lines for chunk in group) for group in groups], "align")
    sampled = 0 < sample < total
    missing = UNSEEN_PROBABILITY if sampled else 0.0
    with tempfile.TemporaryDirectory(prefix="fastalign-") as workdir:
        model = os.path.join(shards.folder, "model") if shards else None
        try:
            if model and os.path.isdir(model):
                logger.info("the model trained by the interrupted run: %s", model)
                table, tension = load_model(model)
            else:
                training = corpus
                if sampled:
                    logger.info("training fast_align's model on %d of the %d pairs, spread "
                                "evenly (--sample); aligning every pair with it", sample, total)
                    training = os.path.join(workdir, "sample")
                    with open(corpus, "rb") as lines, open(training, "wb") as kept:
                        kept.writelines(spread_evenly(lines, sample, total))
                table, tension = train(training, workdir, settings, workers)
                if model:
                    save_model(model, table, tension)
            decoder = dict(corpus=corpus, model=dict(table=table, tension=tension,
                                                     settings=settings, missing=missing))
            gc.freeze()  # the table's objects stay shared with the workers: no collection writes them
            progress = Progress("align", total, unit="pairs", log=logger)
            if shards is None:
                _decode(decoder, chunks, out, workdir, workers, progress)
            else:
                progress.resume(shards.lines_done)
                for index in shards.todo:
                    with shards.writing(index) as (temp, _), open(temp, "wb") as shard:
                        _decode(decoder, groups[index], shard, workdir, workers, progress)
                shards.join(out)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        progress.finish()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m convs2s_preprocess.aligner.fastalign",
        description="fast_align's forward alignment (Pharaoh links on stdout), its model "
                    "trained on every core")
    parser.add_argument("-i", dest="input", required=True, help="source ||| target lines")
    parser.add_argument("-d", dest="favor_diagonal", action="store_true",
                        help="favour alignment points close to the diagonal")
    parser.add_argument("-o", dest="optimize_tension", action="store_true",
                        help="optimize how close to the diagonal they should be")
    parser.add_argument("-v", dest="variational_bayes", action="store_true",
                        help="Dirichlet prior on the translation tables")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes that train and decode (the links are the same for "
                             "any number)")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="train on N pairs spread evenly over the corpus, then align "
                             "every pair (default 0: train on every pair)")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep the trained model and the finished shards of links in DIR, "
                             "and reuse them when run again on the same corpus and options")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s")
    settings = Settings(args.favor_diagonal, args.optimize_tension, args.variational_bayes)
    align(args.input, settings, sys.stdout.buffer, args.workers, args.sample, args.keep)


if __name__ == "__main__":
    main()
