"""How our data preparation's stages scale with the cores of one machine.

``python -m bench.cores --size 2000000 --workers 2 16 [--align] --json cores.json``

``bench.scaling`` extrapolates each stage from the cores at hand to 32 by Amdahl's law, with
the parallel part scaling ideally: an optimistic bound. This measures the scaling instead.
On one corpus built as ``bench.scaling`` builds it, our stages run as ``bench.scaling`` runs
them, once per ``--workers`` count (the most first), alone on the machine: tokenize, clean,
learn BPE, apply BPE and binarize, and with ``--align`` the alignment dictionary. ``--json``
is rewritten as each stage ends, so a run stopped early keeps what it measured. For each
stage and count it prints the wall time, the CPU time of all its processes, the peak memory
of its process tree, the speed-up over the fewest workers, and the serial fraction ``s``
that the fewest and each larger count give by Amdahl's law
(``wall = T1 * (s + (1 - s) / N)``, solved from the two wall times): the share of the stage
that more cores do not shorten (process start, the import of fairseq, this process's
reading and writing). Run it on a machine with many cores, alone; a smoke run:
``python -m bench.cores --size 20000 --workers 1 2 --merges 500``. Counts above the
machine's cores still give each stage's memory for that many workers, not its times.
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from convs2s_preprocess.runtime.atomic import atomic_outputs
from convs2s_preprocess.runtime.host import usable_cores
from convs2s_recipes.corpora import data_root
from fairseq_convs2s_ext.hardware import cpu_model

from .scaling import PREPARATION, base_pairs, build_corpus, ours, serial_from_walls


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cores", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=2_000_000, help="pairs (default 2000000)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, usable_cores()],
                        help="worker counts, at least two (default: 2 and the cores this process "
                             "may use)")
    parser.add_argument("--merges", type=int, default=40_000, help="BPE merges (default 40000)")
    parser.add_argument("--align", action="store_true", help="also the alignment dictionary")
    parser.add_argument("--workdir", help="where the corpus and outputs go (default: temporary)")
    parser.add_argument("--json", metavar="FILE", help="write the measurements")
    args = parser.parse_args(argv)
    counts = sorted(set(args.workers))
    if len(counts) < 2:
        parser.error("--workers: give at least two counts")
    machine = f"{cpu_model()}, {os.cpu_count()} cores"
    with tempfile.TemporaryDirectory(prefix="convs2s-cores-") as temp:
        work = Path(args.workdir or temp)
        (work / "out").mkdir(parents=True, exist_ok=True)
        build_corpus(base_pairs(Path(data_root())), args.size, work / "raw")
        runs = {workers: {} for workers in counts}

        def measured(workers, stage, run):
            print(f"{workers} workers: {stage} {run['wall_s']:.1f} s, {run['peak_mib']:.0f} MiB",
                  file=sys.stderr, flush=True)
            runs[workers][stage] = run
            if args.json:  # a run stopped early keeps what it measured
                with atomic_outputs([args.json]) as (temp,):
                    Path(temp).write_text(json.dumps({"machine": machine, "args": vars(args),
                                                      "runs": runs}, indent=2))
        for workers in reversed(counts):  # the most first: the figures a short lease is for
            ours(work / "raw", work / "out", workers, args.merges, align=args.align,
                 measured=lambda stage, run: measured(workers, stage, run))
    print(f"{machine}; {args.size:,} pairs; wall s / CPU s, peak MiB; speed-up over {counts[0]} "
          "workers; serial fraction")
    print(f"{'stage':>10} " + " ".join(f"{f'{n} workers':>34}" for n in counts))
    for stage in PREPARATION + ["align dict"] * args.align:
        cells = []
        for workers in counts:
            run = runs[workers].get(stage)
            if run is None:
                cells.append(f"{'':>34}")
                continue
            cell = f"{run['wall_s']:.1f} / {run['cpu_s']:.1f}, {run['peak_mib']:.0f}"
            base = runs[counts[0]].get(stage)
            if base and workers != counts[0]:
                s = serial_from_walls(counts[0], base["wall_s"], workers, run["wall_s"])
                cell += f" {base['wall_s'] / run['wall_s']:.1f}x s={s:.2f}"
            cells.append(f"{cell:>34}")
        print(f"{stage:>10} " + " ".join(cells))


if __name__ == "__main__":
    main()
