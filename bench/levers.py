"""What each speed lever of convs2s buys: the same model with levers switched off one at a time.

    python -m bench.levers [--checkpoint FCONV.pt] [--data words --vocab-selection] [--batches N] [--beam 5]
                           [--updates N]

Generation (beam search over the test set, fairseq's SequenceGenerator, or with
``--vocab-selection`` the plugin's generator scoring each sentence's candidates) and training
(updates on the same batches) of convs2s imported from the same fconv, with:

- ``no shared source``: the encoder output copied to every hypothesis and reordered with
  the beam at every step (one row per hypothesis, as fconv and the first version did);
- ``no projected source``: each attention projects every hypothesis at every step instead
  of the source once per sentence (``ConvS2SDecoder.projected_sources``);
- ``no weight-norm fold``: generation with weight normalization's g and v kept;
- ``no fc2 fold``: fc2 and the output layer as two products instead of one;
- ``attention kept``: the decoder returns its averaged attention although fairseq-generate
  does not print alignments, so beam search keeps and reorders an attention buffer;
- ``fairseq's criterion``: training with label_smoothed_cross_entropy (log_softmax over the
  whole batch) instead of convs2s_cross_entropy's blockwise loss;
- ``out-of-place sums``: (a + b) * sqrt(0.5) as two new tensors;
- ``bf16``: the whole model under torch.autocast(bfloat16) (only where bf16 is native).

Runs take turns pass by pass, so load from other processes hits them alike; the best
pass counts. Prints one row per variant with its speed relative to ``all levers``.
"""
import argparse
import contextlib
import math
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch

from bench.data import candidates, prepare
from bench.generation import GenerationRun, generation_batches, generation_options
from bench.machine import native_bf16
from bench.models import convs2s_criterion, convs2s_like, convs2s_task, load_fconv, new_fconv, translation_task
from bench.reference import reference_checkpoint
from bench.training import TrainingRun, training_batches


def _plain_reorder(encoder_out, new_order):
    mask = encoder_out["encoder_padding_mask"]
    return {"encoder_out": tuple(t.index_select(0, new_order) for t in encoder_out["encoder_out"]),
            "encoder_padding_mask": None if mask is None else mask.index_select(0, new_order)}


@contextlib.contextmanager
def out_of_place_sums():
    from fairseq_convs2s_ext.models import convs2s_decoder, convs2s_encoder
    from fairseq_convs2s_ext.modules import multistep_attention

    modules = (convs2s_decoder, convs2s_encoder, multistep_attention)
    saved = [m.scaled_sum for m in modules]
    for m in modules:
        m.scaled_sum = lambda a, b: (a + b) * math.sqrt(0.5)
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.scaled_sum = f


def variant(fconv, fconv_args, task, lever):
    """convs2s with one lever off (lever None: all on), and the context to run it in."""
    from fairseq.models import FairseqEncoderDecoderModel

    model = convs2s_like(fconv, fconv_args, task)
    if lever == "no shared source":
        model.encoder.reorder_encoder_out = _plain_reorder
    if lever == "no projected source":
        model.decoder.projected_sources = lambda encoder_out, state: [None] * len(model.decoder.attention)
    if lever == "no weight-norm fold":
        model.make_generation_fast_ = lambda **kw: FairseqEncoderDecoderModel.make_generation_fast_(model, **kw)
    fast = model.decoder.make_generation_fast_  # fairseq calls a bound method
    if lever == "attention kept":
        model.decoder.make_generation_fast_ = types.MethodType(lambda self, **kw: fast(**{**kw, "need_attn": True}),
                                                               model.decoder)
    if lever == "no fc2 fold":
        model.decoder.make_generation_fast_ = types.MethodType(
            lambda self, **kw: setattr(self, "need_attn", kw.get("need_attn", False)), model.decoder)
    return model, out_of_place_sums if lever == "out-of-place sums" else contextlib.nullcontext


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
              "out-of-place sums", *bf16]
    batches = generation_batches(task, 128, limit=args.batches)
    runs = []
    for lever in levers:
        model, context = variant(fconv, fconv_args, task, lever)
        runs.append((lever, context, GenerationRun(str(lever), model, generation_task, generation_options(args.beam),
                                                   "bf16" if lever == "bf16" else "fp32")))
    for _ in range(args.repeats):
        for _, context, run in runs:
            with context():
                run.translate(batches)
    n = sum(len(b["id"]) for b in batches)
    base = min(runs[0][2].times)
    selection = ", vocabulary selection" if args.vocab_selection else ""
    print(f"generation{selection}, {args.data}, beam {args.beam}, {n} sentences, {args.threads} threads "
          f"(best of {args.repeats}):")
    for lever, _, run in runs:
        same = sum(torch.equal(run.hypotheses[i], runs[0][2].hypotheses[i]) for i in run.hypotheses)
        print(f"  {str(lever or 'all levers'):22s} {n / min(run.times):7.1f} sentences/s  "
              f"x{base / min(run.times):.3f} of all levers  identical {same}/{n}")

    if args.updates:
        fresh, fresh_args = new_fconv(task, fconv_args.arch, 0.2)
        batches = training_batches(task, 4000, args.updates + 2)
        runs = []
        for lever in (None, "fairseq's criterion", "out-of-place sums", *bf16):
            model, context = variant(fresh, fresh_args, task, lever)
            criterion = None if lever == "fairseq's criterion" else convs2s_criterion(task)
            runs.append((lever, context, TrainingRun(str(lever), model, task, "bf16" if lever == "bf16" else "fp32",
                                                     criterion=criterion)))
        for sample in batches:
            for _, context, run in runs:
                with context():
                    run.update(sample)
        base = runs[0][2].tokens_per_second(2)
        print(f"training, {args.updates} updates of 4000 tokens:")
        for lever, _, run in runs:
            print(f"  {str(lever or 'all levers'):22s} {run.tokens_per_second(2):7.0f} tokens/s  "
                  f"x{run.tokens_per_second(2) / base:.3f} of all levers")


if __name__ == "__main__":
    main()
