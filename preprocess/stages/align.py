"""``convs2s-align-dict``: the alignment dictionary for unknown-word replacement.

Paper section 4: a word-level model replaces each unknown target word by the dictionary
translation of the source word it attends to most; the dictionary comes from fast_align
run on the training data, each source word mapped to the target word it is most often
aligned to. As in the Lua fairseq, (source word, target word) pairs are counted over all
links of the forward alignment (``fast_align -i corpus -d -o -v``), and the most frequent
target is kept; ties go to the lexicographically smallest target word. Words are compared
exactly as they appear in the tokenized input (no lowercasing), so feed the same
tokenized text the model is trained on. Output: ``align.dict``, one ``source target``
line per source word, sorted, the format fairseq's ``--replace-unk`` reads.

The aligner (``--aligner``; :data:`FAST_ALIGN_SETTINGS` are its options) runs as a separate
process:

- ``fast_align``: the binary, when it is on PATH or given with ``--fast-align PATH``.
- ``builtin``: otherwise: fast_align's model, trained and decoded by this package in
  ``--workers`` processes (by default the cores available), run as ``python -m
  convs2s_preprocess.aligner.fastalign`` (see there and :mod:`..aligner.fastalign_em`: fast_align's EM
  training and forward decision, the same model for any number of processes and on every
  run). On Multi30k its dictionary is the binary's. On a corpus of more than
  ``--train-sample N`` pairs (default
  :data:`DEFAULT_TRAIN_SAMPLE`) the model is trained on N pairs spread over the corpus and
  every pair is aligned with it: training time and memory stop growing with the corpus
  (see :mod:`..aligner.fastalign`; what it costs the dictionary is on the performance page).
  ``--train-sample 0`` trains on every pair whatever the corpus' size.
- ``eflomal``: only when asked for: ``eflomal-align`` (``pip install eflomal``, GPL-3,
  never imported), a different aligner, whose dictionary changes from run to run.

All of them read ``source ||| target`` lines and reject a pair with an empty side, so the
pairs with an empty side, and the pairs containing ``|||`` themselves (which would split
the line in the wrong place), are left out of the aligner's input; the same pairs are left
out when its output is read back, which keeps alignment line N on pair N. Replacing
``|||`` instead would put a made-up token into the dictionary.

The aligner works in a folder beside the output (in ``--tmpdir DIR`` if given: a node's
local disk, say), ``.align-work-HOST-PID-*``, which holds a copy of the corpus, its
links and their counts (on 300,000 built pairs 1.8 times as large as the two tokenized
files together), and is removed when
it ends, fails, or is stopped by SIGINT or SIGTERM (which also stop the aligner). A
SIGKILL, which nothing can catch, leaves the folder behind (on Linux the kernel still
stops the aligner, see :mod:`..runtime.processes`): the next run removes the folders of processes
of this host that no longer exist.

What the builtin aligner finishes outlives an interrupted or killed run: its trained model
and the links of each finished shard of pairs are kept in ``aligner/`` of the step's shard
folder, ``.NAME.shards/`` beside the output (:mod:`..runtime.shards`, ``python -m
convs2s_preprocess.aligner.fastalign --keep``), and the rerun on the same inputs and options loads
the model instead of training again and decodes only the shards not done. Writing the
aligner's input and counting the links start over.

The links are counted in ``--workers`` processes, in memory that does not grow with the
corpus: each worker reads its chunks of the corpus and the links itself, and writes their
counts split into partitions by source word; each partition is then summed by one worker,
and the sorted results are merged (:func:`count_corpus_links`).

With ``--candidates FILE`` it also writes, from the same counts, the candidate lists of
vocabulary selection (fairseq-lua's ``-aligndictpath``; read by ``--vocab-selection``): one
line per source word, sorted, ``source target1 count1 target2 count2 ...`` with its aligned
target words ranked by count (ties: the smaller word first), at most
``CANDIDATES_PER_WORD`` of them, as fairseq-lua kept.
"""
import argparse
import functools
import heapq
import logging
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import zlib
from collections import Counter, defaultdict
from itertools import zip_longest
from typing import Iterable, Iterator, NamedTuple, Optional

from ..runtime.atomic import run_step, running_step, shard_folder
from ..errors import PreprocessError, full_disk_reported
from ..runtime.locking import output_lock
from ..runtime.host import default_workers
from ..runtime.parallel import (LineChunk, line_chunks, map_chunks_into, parallel_chunks,
                                partition_sections, read_chunk, read_section, write_partitions)
from ..runtime.progress import Progress, relay_log_lines, watching
from ..runtime.processes import exit_on_sigterm, process_exists, run_child
from ..runtime.pool import map_batches
from ..runtime.shards import step_folder
from ..textio import count_lines, decode_line, read_lines, sample_option, write_lines

logger = logging.getLogger(__name__)

SEPARATOR = "|||"
# fast_align's options for the paper's dictionary, as the Lua fairseq ran it: favour the
# diagonal (-d), optimize its tension (-o), Dirichlet prior on the translation tables (-v);
# NULL word, p0 = 0.08 and 5 iterations are fast_align's defaults. The binary and
# ``python -m convs2s_preprocess.aligner.fastalign`` take them alike.
FAST_ALIGN_SETTINGS = ("-d", "-o", "-v")
ALIGNERS = ("fast_align", "builtin", "eflomal")
EXECUTABLES = {"fast_align": "fast_align", "eflomal": "eflomal-align"}
INSTALL_HINTS = {
    "fast_align": "build it from https://github.com/clab/fast_align with cmake and make, "
                  "then put `fast_align` on PATH or pass --fast-align PATH",
    "eflomal": "`pip install eflomal` (GPL-3), which provides the `eflomal-align` command",
}
# Lines of the aligner's error output quoted when it fails.
ERROR_TAIL_LINES = 20
WORK_PREFIX = ".align-work-"
WORK_NAME = re.compile(re.escape(WORK_PREFIX) + r"(?P<host>.+)-(?P<pid>\d+)-\w+")
# Target words kept per source word in the candidates file (fairseq-lua's limit).
CANDIDATES_PER_WORD = 1000
# The builtin aligner trains fast_align's model on at most this many pairs of a larger
# corpus (--train-sample), chosen by bench/sampling.py: see the performance page ("Learning
# from a sample": on 2,000,000 pairs, 1,000,000 agree with every pair on 57% of the rare
# words' translations, 500,000 on 38%).
DEFAULT_TRAIN_SAMPLE = 1_000_000
# Counting the links (see count_corpus_links): pairs a worker counts at a time, the
# memory a worker's counts of one partition may take, and all workers' together, what
# they take per byte of the aligner's links file (measured: see count_corpus_links), and
# the most partitions.
COUNT_CHUNK_LINES = 50_000
# Pairs a worker turns into the aligner's input at a time.
INPUT_CHUNK_LINES = 100_000
COUNT_MEMORY_PER_WORKER = 256 * 2**20
COUNT_MEMORY = 4 * 2**30
COUNT_MEMORY_PER_LINK_BYTE = 4
MAX_PARTITIONS = 512


class Aligner(NamedTuple):
    """A word aligner and how to start it; its settings are :data:`FAST_ALIGN_SETTINGS`
    (eflomal's own defaults for eflomal)."""
    name: str  # one of ALIGNERS
    command: tuple  # the program and its first arguments

    def options(self) -> dict:
        """What the dictionary depends on besides the training text."""
        settings = () if self.name == "eflomal" else FAST_ALIGN_SETTINGS
        return {"aligner": self.name, "settings": " ".join(settings)}

    def invocation(self, corpus_path: str, links_path: str, workers: int = 1,
                   train_sample: int = 0, keep: Optional[str] = None) -> tuple:
        """(argv, file receiving stdout) to write the forward links of ``corpus_path``;
        the builtin aligner trains and decodes in ``workers`` processes (its links do not
        depend on them), trains on ``train_sample`` pairs when it is not 0, and keeps its
        model and finished shards of links in ``keep`` if given."""
        if self.name == "eflomal":
            return [*self.command, "-i", corpus_path, "-f", links_path], os.devnull
        own = ["--workers", str(workers), "--sample", str(train_sample),
               *(["--keep", keep] if keep else [])] if self.name == "builtin" else []
        return [*self.command, "-i", corpus_path, *FAST_ALIGN_SETTINGS, *own], links_path


def default_search_path() -> str:
    """PATH plus the directory of this interpreter (a virtualenv's bin, even if inactive)."""
    return os.pathsep.join([os.environ.get("PATH", ""), os.path.dirname(sys.executable)])


def installed_command(name: str, search_path: str) -> Optional[tuple]:
    """The command that starts aligner ``name``, or None if it is not installed."""
    if name == "builtin":
        return sys.executable, "-m", "convs2s_preprocess.aligner.fastalign"
    executable = shutil.which(EXECUTABLES[name], path=search_path)
    return (executable,) if executable else None


def find_aligner(choice: str = "auto", fast_align: Optional[str] = None,
                 search_path: Optional[str] = None) -> Aligner:
    """The aligner to run: an explicit fast_align binary, else the one ``choice`` names.

    ``choice`` is "auto" (the fast_align binary if found, else the builtin one) or one of
    :data:`ALIGNERS`.
    """
    if fast_align:
        if choice not in ("auto", "fast_align"):
            raise PreprocessError(f"--fast-align PATH contradicts --aligner {choice}")
        if not (os.path.isfile(fast_align) and os.access(fast_align, os.X_OK)):
            raise PreprocessError(f"--fast-align {fast_align}: not an executable file")
        return Aligner("fast_align", (fast_align,))
    path = default_search_path() if search_path is None else search_path
    names = ["fast_align", "builtin"] if choice == "auto" else [choice]
    for name in names:
        command = installed_command(name, path)
        if command:
            return Aligner(name, command)
    hints = "; or ".join(f"{name}: {INSTALL_HINTS[name]}" for name in names)
    raise PreprocessError(f"no word aligner found ({' or '.join(names)}; binaries are looked "
                          f"for on {path}). Install {hints}.")


def aligner_line(src: str, tgt: str) -> Optional[str]:
    """The aligner's ``source ||| target`` line of a pair of tokenized lines, or None where
    the aligner must not see the pair: a side is empty or holds ``|||``."""
    if SEPARATOR in src or SEPARATOR in tgt:
        return None
    src_tokens, tgt_tokens = src.split(), tgt.split()
    if not src_tokens or not tgt_tokens:
        return None
    return f"{' '.join(src_tokens)} {SEPARATOR} {' '.join(tgt_tokens)}"


def _aligner_input_chunk(src_path: str, tgt_path: str, chunk: LineChunk, parts: list) -> int:
    """Write the aligner's lines of a chunk of the pairs to ``parts[0]``; return how many."""
    kept = 0
    with open(parts[0], "w", encoding="utf-8", newline="\n") as out:
        pairs = zip(read_chunk(src_path, chunk, 0), read_chunk(tgt_path, chunk, 1))
        for number, (src, tgt) in enumerate(pairs, chunk.first):
            line = aligner_line(decode_line(src, src_path, number), decode_line(tgt, tgt_path, number))
            if line is not None:
                out.write(line + "\n")
                kept += 1
    return kept


def write_aligner_input(src_path: str, tgt_path: str, corpus_path: str, workers: int = 1) -> int:
    """Write the :func:`aligner_line` of every pair that has one, in ``workers`` processes
    that read chunks of the files themselves; return how many."""
    _, chunks = parallel_chunks(src_path, tgt_path, INPUT_CHUNK_LINES)
    parts = os.path.join(os.path.dirname(os.path.abspath(corpus_path)), "input-parts")
    write = functools.partial(_aligner_input_chunk, src_path, tgt_path)
    with open(corpus_path, "wb") as out:
        return sum(n for _, n in map_chunks_into(write, chunks, [out], parts, workers))


def aligner_pair(line: str) -> tuple:
    """(source tokens, target tokens) of a line that :func:`write_aligner_input` wrote."""
    src, tgt = line.split(f" {SEPARATOR} ")
    return src.split(), tgt.split()


def aligner_environment(workdir: str) -> dict:
    """The aligner's environment: temporary files in the work folder, removed with it."""
    return dict(os.environ, TMPDIR=workdir)


def run_aligner(aligner: Aligner, corpus_path: str, links_path: str, workdir: str,
                workers: int = 1, train_sample: int = 0, keep: Optional[str] = None) -> None:
    """Forward-align ``corpus_path``, writing Pharaoh ``i-j`` links to ``links_path``.

    The aligner runs in ``workdir`` as a child process that does not outlive this one.
    ``keep``: see :meth:`Aligner.invocation`.
    """
    cmd, stdout = aligner.invocation(corpus_path, links_path, workers, train_sample, keep)
    log_path = os.path.join(workdir, "aligner.log")
    with open(stdout, "w") as out, open(log_path, "w") as log, \
            watching(log_path, relay_log_lines(logger)):
        returncode = run_child(cmd, out, log, cwd=workdir, env=aligner_environment(workdir))
    if returncode != 0:
        tail = "\n".join(list(read_lines(log_path))[-ERROR_TAIL_LINES:])
        raise PreprocessError(f"{aligner.name} failed with exit status {returncode}:\n"
                              f"  {shlex.join(cmd)}\n{tail}")


def lengths_differ(number: int) -> PreprocessError:
    """The error of an aligner output that ends before its input, or after it, at line ``number``."""
    return PreprocessError(f"the aligner's output and its input differ in length "
                           f"(from line {number} on)")


def count_links(pairs: Iterable[tuple], alignments: Iterable[str], first: int = 1) -> dict:
    """Count (source word, target word) over all links: {source: Counter(target: n)};
    ``first``: the number of the first pair, for the errors."""
    counts = defaultdict(Counter)
    for number, (pair, links) in enumerate(zip_longest(pairs, alignments), first):
        if pair is None or links is None:
            raise lengths_differ(number)
        src, tgt = pair
        try:
            for link in links.split():
                i, j = link.split("-")
                counts[src[int(i)]][tgt[int(j)]] += 1
        except (ValueError, IndexError):
            raise PreprocessError(f"alignment line {number} ({links!r}) does not fit its "
                                  f"sentence pair ({len(src)} and {len(tgt)} tokens)") from None
    return counts


def most_frequent(counts: dict) -> dict:
    """Each source word's most frequent target; ties go to the smallest target word."""
    return {src: min(targets.items(), key=lambda item: (-item[1], item[0]))[0]
            for src, targets in counts.items()}


def work_folder(directory: str) -> tempfile.TemporaryDirectory:
    """The aligner's scratch folder in ``directory``, named after this host and process."""
    prefix = f"{WORK_PREFIX}{socket.gethostname()}-{os.getpid()}-"
    return tempfile.TemporaryDirectory(prefix=prefix, dir=directory)


def remove_stale_work_folders(directory: str) -> None:
    """Remove the work folders left in ``directory`` by killed runs on this host."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        match = WORK_NAME.fullmatch(name)
        if (match and match["host"] == socket.gethostname()
                and not process_exists(int(match["pid"]))):
            logger.info("removing %s, left by process %s, which was killed",
                        name, match["pid"])
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def ranked_candidates(counts: dict, limit: int = CANDIDATES_PER_WORD) -> dict:
    """Each source word's aligned targets with their counts, most frequent first (ties:
    the smaller target first), at most ``limit``."""
    return {src: sorted(targets.items(), key=lambda item: (-item[1], item[0]))[:limit]
            for src, targets in counts.items()}


def candidate_lines(counts: dict) -> Iterator[str]:
    """The lines of the candidates file: ``source target1 count1 target2 count2 ...``."""
    for src, targets in sorted(ranked_candidates(counts).items()):
        yield " ".join([src, *(f"{tgt} {n}" for tgt, n in targets)])


def dictionary_lines(counts: dict) -> Iterator[str]:
    """The lines of the dictionary: ``source target``, sorted."""
    for src, tgt in sorted(most_frequent(counts).items()):
        yield f"{src} {tgt}"


def partition_of(word: str, partitions: int) -> int:
    """The partition whose counts hold source word ``word`` (the same in every process)."""
    return zlib.crc32(word.encode("utf-8")) % partitions


def _count_chunk(corpus_path: str, links_path: str, workdir: str, partitions: int,
                 chunk: LineChunk) -> tuple:
    """Count the links of a chunk of the aligner's input and its links into a file of
    ``workdir``, as ``source target count`` lines, partition after partition; return the
    file and where each partition's lines begin in it, and where the file ends."""
    lines = (line.decode("utf-8") for line in read_chunk(corpus_path, chunk, 0))
    links = (line.decode("utf-8") for line in read_chunk(links_path, chunk, 1))
    texts = defaultdict(list)
    for src, targets in count_links(map(aligner_pair, lines), links, chunk.first).items():
        texts[partition_of(src, partitions)] += (f"{src} {tgt} {n}\n" for tgt, n in targets.items())
    path = os.path.join(workdir, f"counts-{chunk.index}")
    return path, write_partitions(path, texts, partitions)


def _count_partition(task: tuple) -> None:
    """Sum a partition's counts, read from where each chunk's file holds them, and write its
    dictionary lines to PATH.dict and, if asked, its candidate lines to PATH.candidates."""
    path, sections, candidates = task
    counts = defaultdict(Counter)
    for section in sections:
        for line in read_section(*section).splitlines():
            src, tgt, n = line.split(" ")
            counts[src][tgt] += int(n)
    write_lines(path + ".dict", dictionary_lines(counts))
    if candidates:
        write_lines(path + ".candidates", candidate_lines(counts))


def merged_lines(paths: list) -> Iterator[str]:
    """The lines of files that are each sorted by their first word, merged in that order."""
    return heapq.merge(*map(read_lines, paths), key=lambda line: line.split(" ", 1)[0])


def count_partitions(links_bytes: int, workers: int) -> int:
    """Partitions of the counts of a links file of ``links_bytes``, each small enough for
    ``workers`` processes, one partition each, to stay within the memory bounds."""
    share = min(COUNT_MEMORY_PER_WORKER, COUNT_MEMORY // workers) // COUNT_MEMORY_PER_LINK_BYTE
    return max(1, min(MAX_PARTITIONS, -(-links_bytes // share)))


def count_corpus_links(corpus_path: str, links_path: str, workdir: str, workers: int,
                       out_path: str, candidates_path: Optional[str] = None,
                       partitions: Optional[int] = None) -> None:
    """Count the links of every pair of the aligner's input and write the dictionary (and
    the candidates), in ``workers`` processes and in memory that does not grow with the
    corpus.

    Each worker counts chunks of :data:`COUNT_CHUNK_LINES` pairs, which it reads from both
    files itself, and writes each chunk's counts to a file of its own in ``workdir``, split
    by source word into partitions (:func:`partition_of`); then each partition's counts are
    summed, by one worker, into its dictionary and candidate lines, sorted, and the
    partitions' lines are merged. A source word's counts are all in one partition, so the
    result is what counting everything in one process gives. Partitions are as many as
    keep a worker's counts near :data:`COUNT_MEMORY_PER_WORKER`, and all workers' near
    :data:`COUNT_MEMORY` (:func:`count_partitions`), estimated from the links file: the
    counts took 3.9 bytes per byte of the links file on Multi30k en-de (29,000
    real pairs; some 150 bytes per distinct word pair) and 1.2 on 300,000 pairs built from
    the shared data, whose pairs repeat. A corpus with more distinct word pairs per link
    takes more (about 25 if every link were a word pair of its own). ``partitions``
    overrides that number.
    """
    partitions = partitions or count_partitions(os.path.getsize(links_path), workers)
    totals, chunks = line_chunks([corpus_path, links_path], COUNT_CHUNK_LINES)
    if totals[0] != totals[1]:  # one file ends before the other
        raise lengths_differ(min(totals) + 1)
    progress = Progress("count links", totals[0], unit="pairs", log=logger)
    count = functools.partial(_count_chunk, corpus_path, links_path, workdir, partitions)
    counted = []  # (file, offsets) of each chunk
    for chunk, result in zip(chunks, map_batches(count, chunks, workers)):
        counted.append(result)
        progress.update(chunk.lines)
    progress.finish()
    paths = [os.path.join(workdir, f"partition-{partition}") for partition in range(partitions)]
    tasks = [(path, sections, candidates_path is not None)
             for path, sections in zip(paths, partition_sections(counted, partitions))]
    for _ in map_batches(_count_partition, tasks, workers):
        pass
    write_lines(out_path, merged_lines([path + ".dict" for path in paths]))
    if candidates_path is not None:
        write_lines(candidates_path, merged_lines([path + ".candidates" for path in paths]))


def build_align_dict(src_path: str, tgt_path: str, out_path: str, aligner: Aligner,
                     candidates_path: Optional[str] = None, workers: Optional[int] = None,
                     train_sample: Optional[int] = None, tmpdir: Optional[str] = None) -> bool:
    """Write ``out_path``, and ``candidates_path`` if given, atomically unless they are
    current; True if they were built. ``workers``: the aligner's processes, by default the
    cores available (the builtin aligner trains and decodes in them; the dictionary is the
    same for any number). ``train_sample``: the builtin aligner trains on at most this many
    pairs (0: on every pair; None: :data:`DEFAULT_TRAIN_SAMPLE`); the other aligners train on
    every pair. ``tmpdir``: where the aligner's work folder goes (default: beside
    ``out_path``).

    Current means built from inputs with the same contents by the same aligner (see
    :mod:`preprocess.atomic`). A failed rebuild (an empty input, say) leaves an earlier
    dictionary in place, not deleted, so that a mistyped path costs no finished
    alignment; the command fails, and its error says that the dictionary is not built
    from these inputs.
    """
    def build(temp_out: str, temp_candidates: Optional[str] = None) -> None:
        step, keep = running_step(temp_out), None
        if step and aligner.name == "builtin":  # its model and links outlive a killed run
            keep = os.path.join(step_folder(step, "alignment dictionary"), "aligner")
        with work_folder(scratch) as tmp:
            corpus, links = os.path.join(tmp, "corpus"), os.path.join(tmp, "links")
            kept = write_aligner_input(src_path, tgt_path, corpus, processes)
            if kept == 0:
                raise PreprocessError(f"nothing to align in {src_path} / {tgt_path}: every "
                                      f"pair has an empty side or contains {SEPARATOR!r}")
            logger.info("aligning %d pairs with %s: %s (%d left out: empty side or %r), in %s",
                        kept, aligner.name, shlex.join(aligner.command),
                        count_lines(src_path) - kept, SEPARATOR, tmp)
            run_aligner(aligner, corpus, links, tmp, processes, train_sample, keep)
            count_corpus_links(corpus, links, tmp, processes, temp_out, temp_candidates)

    if train_sample and aligner.name != "builtin":
        raise PreprocessError(f"--train-sample is the builtin aligner's: {aligner.name} trains on "
                              f"every pair (use --aligner builtin, or leave --train-sample out)")
    if train_sample is None:
        train_sample = DEFAULT_TRAIN_SAMPLE if aligner.name == "builtin" else 0
    if tmpdir and not os.path.isdir(tmpdir):
        raise PreprocessError(f"--tmpdir {tmpdir}: no such folder; create it or give another")
    processes = default_workers(workers)
    scratch = os.path.abspath(tmpdir or os.path.dirname(os.path.abspath(out_path)))
    remove_stale_work_folders(scratch)
    outputs = [out_path] if candidates_path is None else [out_path, candidates_path]
    return run_step("alignment dictionary", [src_path, tgt_path], outputs, build,
                    {**aligner.options(), **sample_option("train_sample", train_sample, src_path)})


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="convs2s-align-dict",
        description="Build the unknown-word replacement dictionary (source word -> most "
                    "frequently aligned target word) from tokenized training text.")
    parser.add_argument("--src", required=True, help="tokenized source training text")
    parser.add_argument("--tgt", required=True, help="tokenized target training text")
    parser.add_argument("-o", "--output", default="align.dict", help="dictionary to write")
    parser.add_argument("--aligner", choices=["auto", *ALIGNERS], default="auto",
                        help="auto (default): the fast_align binary if found, else builtin: "
                             "fast_align's model, trained by this package on every core")
    parser.add_argument("--fast-align", metavar="PATH", help="the fast_align binary to run")
    parser.add_argument("--candidates", metavar="FILE",
                        help="also write each source word's aligned target words ranked by count, "
                             "with the counts, for vocabulary selection (--vocab-selection FILE)")
    parser.add_argument("--workers", type=int,
                        help="processes that write the aligner's input, train and decode "
                             "fast_align's model (builtin) and count the links (default: the "
                             "cores this process may use)")
    parser.add_argument("--tmpdir", metavar="DIR",
                        help="where the aligner's work folder goes (a copy of the corpus and its "
                             "links; default: beside the output)")
    parser.add_argument("--train-sample", type=int, metavar="N",
                        help=f"builtin: on a larger corpus, train fast_align's model on N "
                             f"pairs spread evenly over it, then align every pair with it, so "
                             f"that training time and memory stop growing with the corpus "
                             f"(default {DEFAULT_TRAIN_SAMPLE}; 0: train on every pair)")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers {args.workers}: give at least 1 (or leave it out: the cores available)")
    if args.train_sample is not None and args.train_sample < 0:
        parser.error(f"--train-sample {args.train_sample}: give a number of pairs, or 0 for all")
    return args


def main(argv: Optional[list] = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s")
    exit_on_sigterm()
    try:
        folder = os.path.dirname(os.path.abspath(args.output))
        with full_disk_reported(args.output), output_lock(folder):
            build_align_dict(args.src, args.tgt, args.output,
                             find_aligner(args.aligner, args.fast_align), args.candidates,
                             args.workers, args.train_sample, args.tmpdir)
    except PreprocessError as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        kept = shard_folder(args.output)
        sys.exit("interrupted: the aligner was stopped and its work folder removed" + (
            f"; what it finished is kept in {kept} for a rerun" if os.path.isdir(kept) else ""))


if __name__ == "__main__":
    main()
