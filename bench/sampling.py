"""What learning from a sample costs: BPE's codes and the alignment dictionary.

``python -m bench.sampling --sizes 100000 500000 2000000 --samples 100000 500000 --json FILE``

**Alignment dictionary.** For each corpus it builds the dictionary of
``convs2s-align-dict`` once with the model trained on every pair, and once per
``--samples`` size smaller than the corpus with ``--train-sample N`` (the model trained on
N pairs spread over the corpus, every pair aligned with it). Each sampled dictionary is
compared with the full one, over the full one's source words:

- ``coverage``: the share of them that the sampled dictionary has at all;
- ``types``: the share translated the same (a missing word counts as different);
- ``tokens``: the same, each word weighted by its count in the corpus' source side;
- ``replaced``: what ``--replace-unk`` writes for the word is the same (it copies the
  source word where the dictionary has none, so a missing entry of a word whose full
  translation is itself, a name say, costs nothing);
- ``rare types``, ``rare replaced``: the same over the words outside the 40,000 most
  frequent source words, which a word-level model of that vocabulary writes as unknown
  and ``--replace-unk`` looks up.

**BPE.** For each corpus in ``--bpe-sizes`` it learns ``--merges`` joint codes from every
pair and every word, from each ``--bpe-samples`` size (``convs2s-prepare --bpe-sample N``)
and with each ``--bpe-max-words`` bound (``convs2s-prepare --bpe-max-words N``: a sample
that holds at most N distinct words, the words it holds recorded), applies each set of
codes to every 10th pair of the corpus, and compares with the full codes' segmentation:
the share of lines segmented the same, the segments per line (a sequence length, which
training time follows) and the distinct segments used.

Every run's wall time, CPU time and peak memory is recorded (meaningful only alone).

Corpora: Multi30k en-de's training set as it is (``multi30k``, 29,000 real pairs; BPE
with 10,000 merges, which it supports), and the sizes asked for, built from the shared
data's en-de pairs as ``bench.scaling`` builds them (about 37k distinct pairs joined and
varied), tokenized. Built corpora converge faster than real ones of the same size: their
vocabulary grows by made-up suffixes, not new words.
"""
import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from subword_nmt.apply_bpe import BPE

from convs2s_preprocess.stages.bpe import SEPARATOR, count_bounded_words, count_words
from convs2s_preprocess.stages.tokenize import normalize_and_tokenize
from convs2s_recipes.corpora import data_root

from .scaling import SRC, TGT, base_pairs, build_corpus, measure

RARE_AFTER = 40_000  # source words beyond this rank: a 40k-word model's unknown words
MULTI30K = "multi30k"
MULTI30K_MERGES = 10_000
EVALUATION_EVERY = 10  # BPE: the segmentations compared are those of every 10th pair


def read_dict(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return dict(line.split(" ", 1) for line in f.read().splitlines())


def source_counts(path: Path) -> Counter:
    counts = Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            counts.update(line.split())
    return counts


def agreement(full: dict, sampled: dict, counts: Counter) -> dict:
    """How far ``sampled`` agrees with ``full`` (see the module docstring)."""
    same = {word for word, target in full.items() if sampled.get(word) == target}
    replaced = {word for word, target in full.items() if sampled.get(word, word) == target}
    rare = sorted(full, key=lambda word: (-counts[word], word))[RARE_AFTER:]
    total_tokens = sum(counts[word] for word in full)

    def share(words: set, among: list):
        return sum(word in words for word in among) / len(among) if among else None
    return {
        "words": len(full),
        "coverage": sum(word in sampled for word in full) / len(full),
        "types": len(same) / len(full),
        "tokens": sum(counts[word] for word in same) / total_tokens,
        "replaced": len(replaced) / len(full),
        "rare_words": len(rare),
        "rare_types": share(same, rare),
        "rare_replaced": share(replaced, rare),
    }


def align_dict(prefix: Path, out: Path, sample: int, workers: int) -> dict:
    """Run convs2s-align-dict (the builtin aligner); its wall time, CPU time and peak memory."""
    argv = [sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", f"{prefix}.{SRC}",
            "--tgt", f"{prefix}.{TGT}", "-o", str(out), "--aligner", "builtin",
            "--workers", str(workers), "--train-sample", str(sample)]
    return measure([(argv, None, None)])


def tokenized_pairs(pairs: list) -> list:
    return [(normalize_and_tokenize(src, SRC), normalize_and_tokenize(tgt, TGT))
            for src, tgt in pairs]


def write_pairs(pairs: list, prefix: Path) -> None:
    for side, lang in enumerate((SRC, TGT)):
        Path(f"{prefix}.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs),
                                            encoding="utf-8")


def run_corpus(name: str, prefix: Path, samples: list, workers: int) -> dict:
    pairs = sum(1 for _ in open(f"{prefix}.{SRC}", encoding="utf-8"))
    print(f"{name}: {pairs:,} pairs, model trained on every pair", file=sys.stderr, flush=True)
    full_path = prefix.parent / f"{name}.full.dict"
    result = {"pairs": pairs, "full": align_dict(prefix, full_path, 0, workers), "samples": {}}
    full, counts = read_dict(full_path), source_counts(Path(f"{prefix}.{SRC}"))
    for sample in sorted(s for s in samples if s < pairs):
        print(f"{name}: trained on {sample:,} pairs", file=sys.stderr, flush=True)
        path = prefix.parent / f"{name}.{sample}.dict"
        run = align_dict(prefix, path, sample, workers)
        result["samples"][str(sample)] = {**run, **agreement(full, read_dict(path), counts)}
    return result


def learn_codes(prefix: Path, codes: Path, merges: int, workers: int, sample: int = 0,
                max_words: int = 0) -> dict:
    """Learn joint BPE as convs2s-prepare does; its wall time, CPU time and peak memory."""
    code = ("from convs2s_preprocess.stages.bpe import learn_joint_bpe\n"
            f"learn_joint_bpe({[f'{prefix}.{SRC}', f'{prefix}.{TGT}']!r}, {str(codes)!r}, "
            f"{merges}, workers={workers}, sample={sample}, max_words={max_words})")
    return measure([([sys.executable, "-c", code], None, None)])


def segment(codes: Path, lines: list) -> list:
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f, separator=SEPARATOR)
    return [bpe.segment(line).split() for line in lines]


def run_bpe(name: str, prefix: Path, merges: int, samples: list, max_words: list, workers: int) -> dict:
    texts = [open(f"{prefix}.{lang}", encoding="utf-8").read().splitlines() for lang in (SRC, TGT)]
    lines = [line for text in texts for line in text[::EVALUATION_EVERY]]
    pairs = len(texts[0])
    del texts
    paths = [f"{prefix}.{SRC}", f"{prefix}.{TGT}"]
    print(f"{name}: BPE from every pair", file=sys.stderr, flush=True)
    full_codes = prefix.parent / f"{name}.codes"
    result = {"pairs": pairs, "merges": merges, "evaluation_lines": len(lines),
              "words": len(count_words(paths, workers)),
              "full": learn_codes(prefix, full_codes, merges, workers), "samples": {}, "max_words": {}}
    full = segment(full_codes, lines)
    result["full"].update(segments_per_line=sum(map(len, full)) / len(lines),
                          distinct_segments=len({s for line in full for s in line}))
    runs = [("samples", sample, f"{sample:,} pairs", {"sample": sample})
            for sample in sorted(s for s in samples if s < pairs)]
    runs += [("max_words", count, f"a sample of at most {count:,} words", {"max_words": count})
             for count in sorted(c for c in max_words if c < result["words"])]
    for kind, size, what, option in runs:
        print(f"{name}: BPE from {what}", file=sys.stderr, flush=True)
        codes = prefix.parent / f"{name}.{kind}.{size}.codes"
        run = learn_codes(prefix, codes, merges, workers, **option)
        if kind == "max_words":
            run.update(words_learned=len(count_bounded_words(paths, workers, max_words=size)))
        learned = segment(codes, lines)
        result[kind][str(size)] = {
            **run, "same_lines": sum(a == b for a, b in zip(learned, full)) / len(lines),
            "segments_per_line": sum(map(len, learned)) / len(lines),
            "distinct_segments": len({s for line in learned for s in line})}
    return result


def print_bpe_table(results: dict) -> None:
    print(f"{'corpus':>10} {'BPE from':>16} {'same lines':>11} {'segments/line':>14} "
          f"{'distinct':>9} {'CPU s':>8} {'peak MiB':>9}")
    for name, result in results.items():
        rows = [("all", result["full"])]
        rows += [(f"{int(size):,} pairs", row) for size, row in result["samples"].items()]
        rows += [(f"<= {int(size):,} words", row) for size, row in result.get("max_words", {}).items()]
        for what, row in rows:
            same = "" if what == "all" else f"{row['same_lines']:.2%}"
            print(f"{name:>10} {what:>16} {same:>11} {row['segments_per_line']:>14.2f} "
                  f"{row['distinct_segments']:>9,} {row['cpu_s']:>8.0f} {row['peak_mib']:>9.0f}")


def print_table(results: dict) -> None:
    columns = ["coverage", "types", "tokens", "replaced", "rare_types", "rare_replaced"]
    print(f"{'corpus':>10} {'trained on':>10} " + " ".join(f"{c.replace('_', ' '):>13}" for c in columns)
          + f" {'CPU s':>8} {'peak MiB':>9}")
    for name, result in results.items():
        full = result["full"]
        print(f"{name:>10} {'all':>10} " + " ".join(f"{'':>13}" for _ in columns)
              + f" {full['cpu_s']:>8.0f} {full['peak_mib']:>9.0f}")
        for sample, row in result["samples"].items():
            shares = ("" if row[c] is None else f"{row[c]:.2%}" for c in columns)
            print(f"{name:>10} {int(sample):>10,} " + " ".join(f"{v:>13}" for v in shares)
                  + f" {row['cpu_s']:>8.0f} {row['peak_mib']:>9.0f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sampling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 500_000],
                        help="built corpora for the dictionary, in pairs (default 100000 500000)")
    parser.add_argument("--samples", type=int, nargs="+", default=[100_000, 500_000],
                        help="training sample sizes (default 100000 500000)")
    parser.add_argument("--multi30k-samples", type=int, nargs="*", default=[5_000, 10_000, 20_000],
                        help="sample sizes on Multi30k's 29,000 real pairs, dictionary and BPE "
                             "(none: leave it out)")
    parser.add_argument("--bpe-sizes", type=int, nargs="*", default=[500_000],
                        help="built corpora for BPE, in pairs (default 500000)")
    parser.add_argument("--bpe-samples", type=int, nargs="+", default=[100_000, 250_000],
                        help="BPE sample sizes (default 100000 250000)")
    parser.add_argument("--bpe-max-words", type=int, nargs="*", default=[],
                        help="learn BPE from samples of at most these many distinct words (default: none)")
    parser.add_argument("--merges", type=int, default=40_000, help="BPE merges (default 40000)")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--only", choices=["dictionary", "bpe"], help="measure only this part")
    parser.add_argument("--workdir", help="where the corpora and results go (default: temporary)")
    parser.add_argument("--json", metavar="FILE", help="write the results, after each run")
    args = parser.parse_args(argv)
    results = {"dictionary": {}, "bpe": {}}

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), **results}, indent=2))
    with tempfile.TemporaryDirectory(prefix="convs2s-sampling-") as temp:
        workdir = Path(args.workdir or temp)
        workdir.mkdir(parents=True, exist_ok=True)
        pairs = tokenized_pairs(base_pairs(Path(data_root())))
        if args.multi30k_samples:
            write_pairs(pairs[:29_000], workdir / MULTI30K)  # Multi30k's training set comes first
        for size in sorted(set(args.sizes + args.bpe_sizes)):
            build_corpus(pairs, size, workdir / str(size))
        runs = [("dictionary", MULTI30K, args.multi30k_samples, None)] * bool(args.multi30k_samples) \
            + [("dictionary", str(size), args.samples, None) for size in sorted(args.sizes)] \
            + [("bpe", MULTI30K, args.multi30k_samples, MULTI30K_MERGES)] * bool(args.multi30k_samples) \
            + [("bpe", str(size), args.bpe_samples, args.merges) for size in sorted(args.bpe_sizes)]
        for part, name, samples, merges in runs:
            if args.only not in (None, part):
                continue
            if part == "dictionary":
                results[part][name] = run_corpus(name, workdir / name, samples, args.workers)
            else:
                results[part][name] = run_bpe(name, workdir / name, merges, samples, args.bpe_max_words,
                                              args.workers)
            save()
    print_table(results["dictionary"])
    print_bpe_table(results["bpe"])


if __name__ == "__main__":
    main()
