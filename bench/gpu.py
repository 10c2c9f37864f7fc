"""fconv against ours on a GPU, as users run them: fairseq-train and fairseq-generate.

``make gpu-check`` runs the CUDA tests, then this: one table with the GPU's name.

- **Training:** ``fairseq-train`` on the demo's data (Multi30k en-de, joint BPE 10k, as
  ``make demo`` prepares it; bench/data.py), NAG with the paper's settings, label smoothing
  0.1, no checkpoints and no validation, for each architecture, batch size (tokens) and
  precision: fconv with fairseq's ``label_smoothed_cross_entropy``, ours with the plugin's
  task and ``convs2s_cross_entropy`` (``--compile``: ours under torch.compile too). The
  figure is the median of fairseq's own target words per second (``wps``) over the log
  intervals after the first third of the updates (start-up, and compilation with
  ``--compile``), and the last interval's loss (base 2, label smoothed: the criteria log the
  same quantity). ``convs2s_wmt_en_de`` has the paper's layers, which are smaller than
  fconv_wmt_en_de's; it runs with fconv's layers and embeddings here, so that both do the same
  arithmetic.
- **Generation:** the benchmark's reference fconv (fconv_iwslt_de_en, trained once by
  ``fairseq-train`` and cached, bench/reference.py) and ours imported from it by
  ``convs2s-import-fconv`` translate test_2016_flickr with ``fairseq-generate``, beam 5,
  batch 128: sentences per second as fairseq-generate reports it, and how many of ours'
  hypotheses are fconv's.

``--cpu`` runs the same commands on the CPU, with a few updates and sentences: a check that
the command works, not a measurement.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import fairseq_convs2s_ext
from convs2s_recipes.settings import fairseq_options

from .data import prepare
from .reference import reference_checkpoint
from .training import SETTINGS

PLUGIN = str(Path(fairseq_convs2s_ext.__file__).parent)
ARCHS = {  # ours' name, fconv's, and the options that give ours fconv's layers
    "wmt_en_ro": ("convs2s_wmt_en_ro", "fconv_wmt_en_ro", []),
    "wmt_en_de": ("convs2s_wmt_en_de", "fconv_wmt_en_de", [
        "--encoder-layers", "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
        "--decoder-layers", "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
        "--encoder-embed-dim", "768", "--decoder-embed-dim", "768", "--decoder-out-embed-dim", "512"]),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", default="wmt_en_ro,wmt_en_de", help=f"of {', '.join(ARCHS)}")
    p.add_argument("--max-tokens", default="4000,12000")
    p.add_argument("--precisions", default="fp32,fp16", help="fp32, fp16 (fairseq's --fp16), amp (--amp)")
    p.add_argument("--updates", type=int, default=300, help="updates of each training run")
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="also train ours with --compile")
    p.add_argument("--skip", default="", help="comma-separated: train,generate")
    p.add_argument("--cpu", action="store_true", help="run on the CPU: a smoke test of this command, few updates")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--logs", type=Path, help="keep each fairseq run's whole output in this folder, written as it runs")
    args = p.parse_args(argv)
    if args.cpu:
        args.updates, args.log_interval, args.precisions = min(args.updates, 6), 2, "fp32"
    elif not torch.cuda.is_available():
        p.error("no CUDA device: run on a machine with a GPU, or pass --cpu for a smoke test")
    return args


def fairseq(tool, *options, log):
    """Run fairseq's ``tool`` (train, generate) in this Python; its output (stdout and stderr),
    written to the file ``log`` as it runs, so that a run stopped by a time limit leaves what it
    printed (``--compile``'s compilation times among it)."""
    command = [sys.executable, "-m", f"fairseq_cli.{tool}", *map(str, options)]
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    output = Path(log).read_text()
    if code != 0:
        raise SystemExit(f"bench.gpu: fairseq-{tool} failed (its whole output: {log}):\n  {' '.join(command)}\n"
                         + output[-3000:])
    return output


def train(args, data_bin, model, arch, max_tokens, precision):
    """fairseq-train of ``model`` (fconv, ours, ours --compile): (median wps, last loss)."""
    ours_arch, fconv_arch, fconv_layers = ARCHS[arch]
    if model == "fconv":
        model_options = ["--arch", fconv_arch, "--criterion", "label_smoothed_cross_entropy"]
    else:
        model_options = ["--user-dir", PLUGIN, "--task", "convs2s_translation", "--arch", ours_arch,
                         "--criterion", "convs2s_cross_entropy", *fconv_layers]
        if model.endswith("--compile"):
            model_options.append("--compile")
    name = f"train-{model.replace(' --', '-')}-{arch}-{max_tokens}-{precision}.log"
    log = fairseq("train", data_bin, *model_options, *fairseq_options(SETTINGS), "--max-tokens", max_tokens,
                  "--max-update", args.updates, "--seed", 1, "--no-save", "--disable-validation",
                  "--log-format", "json", "--log-interval", args.log_interval, "--no-progress-bar",
                  *({"fp32": [], "fp16": ["--fp16"], "amp": ["--amp"]}[precision]), *(["--cpu"] if args.cpu else []),
                  log=args.logs / name)
    records = [json.loads(m) for m in re.findall(r"train_inner \| (\{.*\})", log)]
    if not records:
        raise SystemExit(f"bench.gpu: fairseq-train logged no training interval for {model} {arch}:\n{log[-2000:]}")
    timed = records[len(records) // 3:] or records
    return statistics.median(float(r["wps"]) for r in timed), float(records[-1]["loss"])


def run_training(args, data_bin, results):
    models = ["fconv", "ours"] + (["ours --compile"] if args.compile else [])
    for arch in args.archs.split(","):
        for max_tokens in args.max_tokens.split(","):
            for precision in args.precisions.split(","):
                row = results.setdefault("train", {}).setdefault(f"{arch}, {max_tokens} tokens, {precision}", {})
                for model in models:
                    print(f"fairseq-train {model} {arch}, {max_tokens} tokens, {precision}", file=sys.stderr, flush=True)
                    row[model] = train(args, data_bin, model, arch, max_tokens, precision)
                    print(f"  {row[model][0]:,.0f} target words/s, loss {row[model][1]:.2f}", file=sys.stderr, flush=True)
                    save(args, results)


def translations(log):
    """{sentence id: hypothesis} and the sentences per second of fairseq-generate's output."""
    hypotheses = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.M))
    speed = re.search(r"Translated [\d,]+ sentences .* \(([\d.]+) sentences/s", log)
    return hypotheses, float(speed.group(1)) if speed else float("nan")


def run_generation(args, data_bin, results):
    limit = ["--max-sentences", 16, "--max-len-a", 1.2, "--max-len-b", 10] if args.cpu else ["--batch-size", 128]
    with tempfile.TemporaryDirectory() as tmp:
        if args.cpu:  # a model of a few updates: the commands' check, not a translation worth timing
            fairseq("train", data_bin, "--arch", "fconv_iwslt_de_en", "--criterion", "label_smoothed_cross_entropy",
                    *fairseq_options(SETTINGS), "--max-tokens", 1000, "--max-update", 2, "--cpu", "--save-dir", tmp,
                    "--no-epoch-checkpoints", "--disable-validation", "--no-progress-bar",
                    log=args.logs / "train-fconv-smoke-test.log")
            fconv = Path(tmp) / "checkpoint_last.pt"
        else:
            fconv = reference_checkpoint(data_bin)
        ours = Path(tmp) / "ours.pt"
        subprocess.run([sys.executable, "-m", "fairseq_convs2s_ext.cli.import_fconv", str(fconv), str(ours),
                        "--source-dict", str(Path(data_bin) / "dict.en.txt"),
                        "--target-dict", str(Path(data_bin) / "dict.de.txt")], check=True, stdout=subprocess.DEVNULL)
        for precision in args.precisions.split(","):
            common = [data_bin, "--gen-subset", "test", "--beam", 5, "--required-batch-size-multiple", 1, *limit,
                      *(["--fp16"] if precision == "fp16" else []), *(["--cpu"] if args.cpu else [])]
            stock, stock_speed = translations(fairseq("generate", *common, "--path", fconv, "--user-dir", PLUGIN,
                                                      log=args.logs / f"generate-fconv-{precision}.log"))
            lean, speed = translations(fairseq("generate", *common, "--path", ours, "--user-dir", PLUGIN,
                                               "--task", "convs2s_translation",
                                               log=args.logs / f"generate-ours-{precision}.log"))
            results.setdefault("generate", {})[f"beam 5, {precision}"] = {
                "fconv": stock_speed, "ours": speed, "identical": sum(lean.get(i) == h for i, h in stock.items()),
                "sentences": len(stock)}
            save(args, results)


def save(args, results):
    """Write what is measured so far to ``--json``: a run stopped by its time limit keeps it."""
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1, default=str))


def print_table(args, results):
    print(f"\n{results['device']}; torch {results['torch']}; demo data (Multi30k en-de, BPE 10k); {args.updates} updates")
    if "train" in results:
        models = [m for m in next(iter(results["train"].values()))]
        print("\nfairseq-train, target words/s (median of fairseq's wps after the first third), last loss")
        print(f"{'':34}" + "".join(f"{m:>22}" for m in models) + "".join(f"{m + ' / fconv':>25}" for m in models[1:]))
        for name, row in results["train"].items():
            speeds = [f"{row[m][0]:,.0f} ({row[m][1]:.2f})" if m in row else "-" for m in models]
            ratios = [f"{row[m][0] / row['fconv'][0]:.2f}x" if m in row else "-" for m in models[1:]]
            print(f"{name:34}" + "".join(f"{c:>22}" for c in speeds) + "".join(f"{c:>25}" for c in ratios))
        fp16 = [(name, row) for name, row in results["train"].items() if name.endswith("fp16")]
        for name, row in fp16:
            fp32 = results["train"].get(name[: -len("fp16")] + "fp32")
            if fp32 and "ours" in row and "ours" in fp32:
                print(f"ours fp16 / ours fp32, {name[: -len(', fp16')]}: {row['ours'][0] / fp32['ours'][0]:.2f}x")
    if "generate" in results:
        print("\nfairseq-generate, sentences/s (test_2016_flickr)")
        for name, row in results["generate"].items():
            print(f"{name:20} fconv {row['fconv']:.1f}  ours {row['ours']:.1f}  {row['ours'] / row['fconv']:.2f}x  "
                  f"identical hypotheses {row['identical']} of {row['sentences']}")


def main(argv=None):
    args = parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    data_bin = prepare("demo")
    results = {"device": "CPU (smoke test, not a measurement)" if args.cpu else torch.cuda.get_device_name(),
               "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        args.logs = args.logs or Path(tmp)
        args.logs.mkdir(parents=True, exist_ok=True)
        try:
            run(args, skip, data_bin, results)
        finally:
            print_table(args, results)
            save(args, results)


def run(args, skip, data_bin, results):
    """The measurements not skipped, each saved into ``results`` as it ends."""
    if "train" not in skip:
        run_training(args, data_bin, results)
    if "generate" not in skip:
        run_generation(args, data_bin, results)


if __name__ == "__main__":
    main()
