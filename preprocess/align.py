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

With ``--candidates FILE`` it also writes, from the same counts, the candidate lists of
vocabulary selection (fairseq-lua's ``-aligndictpath``; read by ``--vocab-selection``): one
line per source word, sorted, ``source target1 count1 target2 count2 ...`` with its aligned
target words ranked by count (ties: the smaller word first), at most
``CANDIDATES_PER_WORD`` of them, as fairseq-lua kept.

The aligner is an external program run as a separate process: the ``fast_align`` binary
(on PATH or ``--fast-align PATH``) or else ``eflomal-align`` (``pip install eflomal``,
GPL-3, never imported). Both read ``source ||| target`` lines and reject a pair with an
empty side, so the pairs with an empty side, and the pairs containing ``|||`` themselves
(which would split the line in the wrong place), are left out of the aligner's input; the
same pairs are left out when its output is read back, which keeps alignment line N on
pair N. Replacing ``|||`` instead would put a made-up token into the dictionary.
"""
import argparse
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from itertools import zip_longest
from typing import Iterable, Iterator, NamedTuple, Optional

from .atomic import run_step
from .errors import PreprocessError
from .textio import check_parallel, count_lines, read_lines, write_lines

logger = logging.getLogger(__name__)

SEPARATOR = "|||"
EXECUTABLES = {"fast_align": "fast_align", "eflomal": "eflomal-align"}
INSTALL_HINT = (
    "Install one of them: fast_align (build it from https://github.com/clab/fast_align with "
    "cmake and make, then put `fast_align` on PATH or pass --fast-align PATH), or eflomal "
    "(`pip install eflomal`, GPL-3, which provides the `eflomal-align` command)."
)
# Lines of the aligner's error output quoted when it fails.
ERROR_TAIL_LINES = 20
# Target words kept per source word in the candidates file (fairseq-lua's limit).
CANDIDATES_PER_WORD = 1000


class Aligner(NamedTuple):
    name: str  # "fast_align" or "eflomal"
    executable: str


def default_search_path() -> str:
    """PATH plus the directory of this interpreter (a virtualenv's bin, even if inactive)."""
    return os.pathsep.join([os.environ.get("PATH", ""), os.path.dirname(sys.executable)])


def find_aligner(choice: str = "auto", fast_align: Optional[str] = None,
                 search_path: Optional[str] = None) -> Aligner:
    """The aligner to run: an explicit fast_align binary, else the first one found.

    ``choice`` is "auto" (fast_align, then eflomal), "fast_align" or "eflomal".
    """
    if fast_align:
        if choice == "eflomal":
            raise PreprocessError("--fast-align PATH contradicts --aligner eflomal")
        if not (os.path.isfile(fast_align) and os.access(fast_align, os.X_OK)):
            raise PreprocessError(f"--fast-align {fast_align}: not an executable file")
        return Aligner("fast_align", fast_align)
    path = default_search_path() if search_path is None else search_path
    names = list(EXECUTABLES) if choice == "auto" else [choice]
    for name in names:
        executable = shutil.which(EXECUTABLES[name], path=path)
        if executable:
            return Aligner(name, executable)
    wanted = " or ".join(EXECUTABLES[name] for name in names)
    raise PreprocessError(f"no word aligner found: neither {wanted} is on the search path "
                          f"({path}). {INSTALL_HINT}")


def aligned_pairs(src_path: str, tgt_path: str) -> Iterator[tuple]:
    """(source tokens, target tokens) of every pair handed to the aligner, in order."""
    check_parallel(src_path, tgt_path)
    for src, tgt in zip(read_lines(src_path), read_lines(tgt_path)):
        if SEPARATOR in src or SEPARATOR in tgt:
            continue
        src_tokens, tgt_tokens = src.split(), tgt.split()
        if src_tokens and tgt_tokens:
            yield src_tokens, tgt_tokens


def write_aligner_input(src_path: str, tgt_path: str, corpus_path: str) -> int:
    """Write ``source ||| target`` lines for :func:`aligned_pairs`; return their number."""
    return write_lines(corpus_path, (f"{' '.join(src)} {SEPARATOR} {' '.join(tgt)}"
                                     for src, tgt in aligned_pairs(src_path, tgt_path)))


def run_aligner(aligner: Aligner, corpus_path: str, links_path: str) -> None:
    """Forward-align ``corpus_path``, writing Pharaoh ``i-j`` links to ``links_path``."""
    if aligner.name == "fast_align":  # writes the links to stdout
        cmd, stdout = [aligner.executable, "-i", corpus_path, "-d", "-o", "-v"], links_path
    else:
        cmd, stdout = [aligner.executable, "-i", corpus_path, "-f", links_path], os.devnull
    with open(stdout, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-ERROR_TAIL_LINES:])
        raise PreprocessError(f"{aligner.name} failed with exit status {proc.returncode}:\n"
                              f"  {shlex.join(cmd)}\n{tail}")


def count_links(pairs: Iterable[tuple], alignments: Iterable[str]) -> dict:
    """Count (source word, target word) over all links: {source: Counter(target: n)}."""
    counts = defaultdict(Counter)
    for number, (pair, links) in enumerate(zip_longest(pairs, alignments), 1):
        if pair is None or links is None:
            raise PreprocessError(f"the aligner's output and its input differ in length "
                                  f"(from line {number} on)")
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


def ranked_candidates(counts: dict, limit: int = CANDIDATES_PER_WORD) -> dict:
    """Each source word's aligned targets with their counts, most frequent first (ties:
    the smaller target first), at most ``limit``."""
    return {src: sorted(targets.items(), key=lambda item: (-item[1], item[0]))[:limit]
            for src, targets in counts.items()}


def candidate_lines(counts: dict) -> Iterator[str]:
    """The lines of the candidates file: ``source target1 count1 target2 count2 ...``."""
    for src, targets in sorted(ranked_candidates(counts).items()):
        yield " ".join([src, *(f"{tgt} {n}" for tgt, n in targets)])


def build_align_dict(src_path: str, tgt_path: str, out_path: str, aligner: Aligner,
                     candidates_path: Optional[str] = None) -> bool:
    """Write ``out_path``, and ``candidates_path`` if given (atomically; skipped if they
    exist); True if they were built."""
    def build(temp_out: str, temp_candidates: Optional[str] = None) -> None:
        workdir = os.path.dirname(os.path.abspath(temp_out))
        with tempfile.TemporaryDirectory(prefix=".align-work-", dir=workdir) as tmp:
            corpus, links = os.path.join(tmp, "corpus"), os.path.join(tmp, "links")
            kept = write_aligner_input(src_path, tgt_path, corpus)
            if kept == 0:
                raise PreprocessError(f"nothing to align in {src_path} / {tgt_path}: every "
                                      f"pair has an empty side or contains {SEPARATOR!r}")
            logger.info("aligning %d pairs with %s (%d left out: empty side or %r)",
                        kept, aligner.executable, count_lines(src_path) - kept, SEPARATOR)
            run_aligner(aligner, corpus, links)
            counts = count_links(aligned_pairs(src_path, tgt_path), read_lines(links))
        write_lines(temp_out, (f"{src} {tgt}" for src, tgt in sorted(most_frequent(counts).items())))
        if temp_candidates is not None:
            write_lines(temp_candidates, candidate_lines(counts))

    outputs = [out_path] if candidates_path is None else [out_path, candidates_path]
    return run_step("alignment dictionary", [src_path, tgt_path], outputs, build)


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="convs2s-align-dict",
        description="Build the unknown-word replacement dictionary (source word -> most "
                    "frequently aligned target word) from tokenized training text.")
    parser.add_argument("--src", required=True, help="tokenized source training text")
    parser.add_argument("--tgt", required=True, help="tokenized target training text")
    parser.add_argument("-o", "--output", default="align.dict", help="dictionary to write")
    parser.add_argument("--aligner", choices=["auto", *EXECUTABLES], default="auto",
                        help="auto: fast_align if found, else eflomal-align")
    parser.add_argument("--fast-align", metavar="PATH", help="the fast_align binary to run")
    parser.add_argument("--candidates", metavar="FILE",
                        help="also write each source word's aligned target words ranked by count, "
                             "with the counts, for vocabulary selection (--vocab-selection FILE)")
    return parser.parse_args(argv)


def main(argv: Optional[list] = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s")
    try:
        build_align_dict(args.src, args.tgt, args.output,
                         find_aligner(args.aligner, args.fast_align), args.candidates)
    except PreprocessError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
