"""What each speed lever of convs2s buys: the same model with levers switched off one at a time.

    python -m bench.levers [--checkpoint FCONV.pt] [--data words --vocab-selection] [--batches N] [--beam 5]
                           [--updates N]

Generation (beam search over the test set, fairseq's SequenceGenerator, or with
``--vocab-selection`` the plugin's generator scoring each sentence's candidates) and training
(updates on the same batches) of convs2s imported from the same fconv, with, each an option
of the model:

- ``no shared source``: the encoder output copied to every hypothesis and reordered with
  the beam at every step (one row per hypothesis, as fconv and the first version did;
  ``ConvS2SEncoder.share_source``);
- ``no projected source``: each attention projects every hypothesis at every step instead
  of the source once per sentence (``ConvS2SDecoder.project_sources_once``);
- ``no weight-norm fold``: generation with weight normalization's g and v kept
  (``ConvS2SModel.fold_weight_norm``);
- ``no fc2 fold``: fc2 and W_o as two products instead of one (``ConvS2SDecoder.fold_fc2``);
- ``attention kept``: the decoder returns its averaged attention although fairseq-generate
  does not print alignments (fairseq's ``need_attn``, as with ``--print-alignment``), so
  beam search keeps and reorders an attention buffer;
- ``fairseq's criterion``: training with label_smoothed_cross_entropy (log_softmax over the
  whole batch) instead of convs2s_cross_entropy's blockwise loss;
- ``bf16``: the whole model under torch.autocast(bfloat16) (only where bf16 is native).

The in-place sums ((a + b) * sqrt(0.5) as one new tensor, ``modules/scaling.py``) are no
lever any more: they measured within the noise in every run (bench/README.md, "What each
lever bought"), and switching them would take a branch in every residual sum.

Runs take turns pass by pass, so load from other processes hits them alike; the best
pass counts. Prints one row per variant with its speed relative to ``all levers``.
"""
import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch

from bench.data import candidates, prepare
from bench.generation import GenerationRun, generation_batches, generation_options
from bench.machine import native_bf16
from bench.models import convs2s_criterion, convs2s_like, convs2s_task, load_fconv, new_fconv, translation_task
from bench.reference import reference_checkpoint
from bench.training import TrainingRun, training_batches


def variant(fconv, fconv_args, task, lever):
    """convs2s with one lever off (lever None: all on)."""
    model = convs2s_like(fconv, fconv_args, task)
    model.encoder.share_source = lever != "no shared source"
    model.decoder.project_sources_once = lever != "no projected source"
    model.fold_weight_norm = lever != "no weight-norm fold"
    model.decoder.fold_fc2 = lever != "no fc2 fold"
    return model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="trained fconv checkpoint (default: bench/reference.py's)")
    p.add_argument("--data", choices=["demo", "words"], default="demo", help="as bench.benchmark's")
    p.add_argument("--vocab-selection", nargs="?", const="build", metavar="FILE",
                   help="generate with vocabulary selection (the candidates FILE, default: built as "
                        "bench.benchmark builds it)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batches", type=int, default=None, help="test batches of 128 (default: all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--updates", type=int, default=20, help="timed training updates per variant (0: none)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data_bin = prepare(args.data)
    task = translation_task(data_bin)
    fconv, fconv_args = load_fconv(args.checkpoint or reference_checkpoint(data_bin), task)
    if args.vocab_selection == "build":
        args.vocab_selection = str(candidates(args.data))
    generation_task = convs2s_task(data_bin, vocab_selection=args.vocab_selection) if args.vocab_selection else task

    bf16 = ["bf16"] if native_bf16() else []  # emulated bf16 runs hundreds of times slower
    levers = [None, "no shared source", "no projected source", "no weight-norm fold", "no fc2 fold", "attention kept",
              *bf16]
    batches = generation_batches(task, 128, limit=args.batches)
    runs = []
    for lever in levers:
        runs.append((lever, GenerationRun(str(lever), variant(fconv, fconv_args, task, lever), generation_task,
                                          generation_options(args.beam), "bf16" if lever == "bf16" else "fp32",
                                          need_attn=lever == "attention kept")))
    for _ in range(args.repeats):
        for _, run in runs:
            run.translate(batches)
    n = sum(len(b["id"]) for b in batches)
    base = min(runs[0][1].times)
    selection = ", vocabulary selection" if args.vocab_selection else ""
    print(f"generation{selection}, {args.data}, beam {args.beam}, {n} sentences, {args.threads} threads "
          f"(best of {args.repeats}):")
    for lever, run in runs:
        same = sum(torch.equal(run.hypotheses[i], runs[0][1].hypotheses[i]) for i in run.hypotheses)
        print(f"  {str(lever or 'all levers'):22s} {n / min(run.times):7.1f} sentences/s  "
              f"x{base / min(run.times):.3f} of all levers  identical {same}/{n}")

    if args.updates:
        fresh, fresh_args = new_fconv(task, fconv_args.arch, 0.2)
        batches = training_batches(task, 4000, args.updates + 2)
        runs = []
        for lever in (None, "fairseq's criterion", *bf16):
            criterion = None if lever == "fairseq's criterion" else convs2s_criterion(task)
            runs.append((lever, TrainingRun(str(lever), variant(fresh, fresh_args, task, lever), task,
                                            "bf16" if lever == "bf16" else "fp32", criterion=criterion)))
        for sample in batches:
            for _, run in runs:
                run.update(sample)
        base = runs[0][1].tokens_per_second(2)
        print(f"training, {args.updates} updates of 4000 tokens:")
        for lever, run in runs:
            print(f"  {str(lever or 'all levers'):22s} {run.tokens_per_second(2):7.0f} tokens/s  "
                  f"x{run.tokens_per_second(2) / base:.3f} of all levers")


if __name__ == "__main__":
    main()
