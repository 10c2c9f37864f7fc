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


def count(task, lean_task, fconv, fconv_args, max_tokens=4000, batch_size=16):
    """{run: {metric: operators that compute}}: a training update of fconv and of ours with the
    fused loss (the GPU's; the blockwise one, the CPU's, apart), and a beam-5 decoder step of
    fconv, ours with fairseq's step (the GPU's) and ours with the lean step (the CPU's)."""
    from bench.generation import GenerationRun, generation_batches, generation_options
    from bench.models import convs2s_like, fconv_copy
    from bench.training import SETTINGS, TrainingRun, training_batches
    from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion

    def ours_training(loss):
        criterion = ConvS2SCrossEntropyCriterion(task, SETTINGS.criterion.label_smoothing, loss)
        return TrainingRun("ours", convs2s_like(fconv, fconv_args, task), task, criterion=criterion)

    sample = training_batches(task, max_tokens, 1)[0]
    training = {"fconv": TrainingRun("fconv", fconv_copy(fconv, fconv_args, task), task),
                "ours": ours_training("fused"), "ours, blockwise loss": ours_training("blockwise")}
    results = {}
    for name, run in training.items():
        forward, backward = training_operators(run, sample)
        results[name] = {"train operators, forward": forward.kernels, "train operators, backward": backward.kernels}
    batch = generation_batches(task, batch_size, limit=1)[0]
    options = generation_options(5, 1.2, 10)
    generation = {"fconv": GenerationRun("fconv", fconv_copy(fconv, fconv_args, task), task, options),
                  "ours, stock search": GenerationRun("stock", convs2s_like(fconv, fconv_args, task), task, options),
                  "ours": GenerationRun("lean", convs2s_like(fconv, fconv_args, task), lean_task, options)}
    for name, run in generation.items():
        counter, steps = generation_operators(run, batch)
        results.setdefault(name, {})["beam 5 operators a step"] = counter.kernels / steps
    return results


def main(argv=None):
    from bench.data import prepare
    from bench.models import convs2s_task, new_fconv, translation_task
    from bench.training import SETTINGS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="demo", choices=["demo", "words"])
    p.add_argument("--arch", default="fconv_iwslt_de_en")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=16, help="sentences translated (beam 5)")
    args = p.parse_args(argv)
    data_bin = prepare(args.data)
    task, lean_task = translation_task(data_bin), convs2s_task(data_bin, beam_step="lean")
    fconv, fconv_args = new_fconv(task, args.arch, SETTINGS.model.dropout)
    results = count(task, lean_task, fconv, fconv_args, args.max_tokens, args.batch_size)
    print(f"arch {args.arch}; operators that compute (views and allocations left out): a training update "
          f"of {args.max_tokens} tokens (ours: the fused loss, the GPU's), a beam-5 step of {args.batch_size} "
          f"sentences (ours: the lean step, the CPU's)")
    metrics = ["train operators, forward", "train operators, backward", "beam 5 operators a step"]
    print(f"{'':22}" + "".join(f"{m:>28}" for m in metrics))
    for name, row in results.items():
        print(f"{name:22}" + "".join(f"{row[m]:>28.0f}" if m in row else f"{'-':>28}" for m in metrics))


if __name__ == "__main__":
    main()
