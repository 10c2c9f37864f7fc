"""How many operators torch dispatches in a training update and a generation step.

On a GPU each operator that computes is one or more kernel launches, and a model of this
size is bound by them (bench/README.md, "Figures on an NVIDIA H100 80GB HBM3"), so the count
measured here, on any device, predicts the GPU's launch overhead. A ``TorchDispatchMode``
sees every aten operator, forward and backward (the autograd engine runs CPU work in the
calling thread); views (which launch nothing) are counted apart.

``python -m bench.operators``: fconv against ours on one batch of the benchmark's data, with
identical weights, as the benchmark runs them.
"""
import argparse
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operators that only allocate or describe memory: no kernel runs.
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
              "lift_fresh", "_unsafe_view", "view", "_to_copy_meta"}


class OperatorCounter(TorchDispatchMode):
    """Counts aten operators by name; ``kernels`` leaves out views and allocations."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__, func.is_view] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def kernels(self) -> int:
        return sum(n for (name, view), n in self.counts.items() if not view and name not in _NO_KERNEL)

    def most_common(self, n=10):
        by_name = collections.Counter()
        for (name, view), count in self.counts.items():
            if not view and name not in _NO_KERNEL:
                by_name[name] += count
        return by_name.most_common(n)


def training_operators(run, sample):
    """Operators of one training update of a :class:`bench.training.TrainingRun`: the forward
    pass with the loss, and the backward pass (clipping and the optimizer step are the same
    code for both models and left out)."""
    run.model.train()
    run.optimizer.zero_grad(set_to_none=True)
    forward, backward = OperatorCounter(), OperatorCounter()
    with forward:
        loss, _, _ = run.criterion(run.model, sample)
    with backward:
        loss.backward()
    return forward, backward


def generation_operators(run, sample):
    """Operators per decoder step of a :class:`bench.generation.GenerationRun` translating
    ``sample``: the whole search (encoder, decoder steps, beam search) over its steps."""
    counter = OperatorCounter()
    with counter:
        run.translate_batch(sample)
    steps = max(len(h) for h in run.hypotheses.values())
    return counter, steps


def main(argv=None):
    from bench.data import prepare
    from bench.generation import GenerationRun, generation_batches, generation_options
    from bench.models import convs2s_like, convs2s_task, fconv_copy, new_fconv, translation_task
    from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion
    from bench.training import SETTINGS, TrainingRun, training_batches

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="demo", choices=["demo", "words"])
    p.add_argument("--arch", default="fconv_iwslt_de_en")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=16, help="sentences translated (beam 5)")
    p.add_argument("--top", type=int, default=0, help="also list each run's N most frequent operators")
    args = p.parse_args(argv)
    data_bin = prepare(args.data)
    task, lean_task = translation_task(data_bin), convs2s_task(data_bin)
    fconv, fconv_args = new_fconv(task, args.arch, SETTINGS.model.dropout)
    print(f"arch {args.arch}, one batch of {args.max_tokens} tokens (training), {args.batch_size} sentences at "
          f"beam 5 (generation, up to 1.2 x source + 10 tokens); operators that compute (views and "
          f"allocations left out), all dispatched in brackets")
    sample = training_batches(task, args.max_tokens, 1)[0]
    runs = [TrainingRun("fconv", fconv_copy(fconv, fconv_args, task), task)]
    for loss in ("fused", "blockwise"):  # the loss measured faster on a GPU, and on a CPU
        criterion = ConvS2SCrossEntropyCriterion(task, SETTINGS.criterion.label_smoothing, loss)
        runs.append(TrainingRun(f"ours, {loss} loss", convs2s_like(fconv, fconv_args, task), task, criterion=criterion))
    rows = {}
    for run in runs:
        forward, backward = training_operators(run, sample)
        rows[run.name] = {"train forward": forward, "train backward": backward}
    batch = generation_batches(task, args.batch_size, limit=1)[0]
    options = generation_options(5, 1.2, 10)
    generation = [GenerationRun("fconv", fconv_copy(fconv, fconv_args, task), task, options),
                  GenerationRun("ours, stock search", convs2s_like(fconv, fconv_args, task), task, options),
                  GenerationRun("ours, lean step", convs2s_like(fconv, fconv_args, task), lean_task, options)]
    for run in generation:
        counter, steps = generation_operators(run, batch)
        rows.setdefault(run.name, {})["generation, per step"] = (counter, steps)
    phases = ["train forward", "train backward", "generation, per step"]
    print(f"{'':24}" + "".join(f"{phase:>24}" for phase in phases))
    for name, row in rows.items():
        cells = []
        for phase in phases:
            value = row.get(phase)
            if value is None:
                cells.append("-")
            elif isinstance(value, tuple):
                counter, steps = value
                cells.append(f"{counter.kernels / steps:.0f} ({counter.total / steps:.0f})")
            else:
                cells.append(f"{value.kernels} ({value.total})")
        print(f"{name:24}" + "".join(f"{c:>24}" for c in cells))
    if args.top:
        for name, row in rows.items():
            for phase, value in row.items():
                counter = value[0] if isinstance(value, tuple) else value
                print(f"\n{name}, {phase}: " + ", ".join(f"{op} {n}" for op, n in counter.most_common(args.top)))


if __name__ == "__main__":
    main()
