"""Peak memory of one workload, in a process of its own.

``python -m bench.memory {train,generate} CHECKPOINT ...`` loads one model, then resets
the kernel's peak-RSS counter (``/proc/self/clear_refs``, Linux >= 4.0) and runs the
workload; it prints the resident memory before it and the peak during it (``VmHWM``).
The difference is what the workload itself needed: activations, gradients, optimizer
state, beam-search buffers, whatever allocator caches torch kept, all as the OS sees them
(tracemalloc does not see torch's allocations). Without clear_refs the peak is
``ru_maxrss``, which also counts loading. On CUDA the peak is
``torch.cuda.max_memory_allocated``. benchmark.py runs it with ``MALLOC_MMAP_THRESHOLD_=65536``,
so glibc hands every freed block of 64 KiB or more back at once and the peak measures what
the workload holds.
"""
import argparse
import gc
import json
import resource
import sys


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(workload, device="cpu"):
    """Run `workload()`; return (resident MiB before, peak MiB during)."""
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        workload()
        torch.cuda.synchronize()
        return before / 2**20, torch.cuda.max_memory_allocated() / 2**20
    before = _status_kib("VmRSS")
    peak_field = "VmHWM" if reset_peak() else None
    workload()
    peak = _status_kib(peak_field) if peak_field else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return before / 1024, peak / 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["train", "generate"])
    parser.add_argument("checkpoint")
    parser.add_argument("--data", required=True)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--max-len-a", type=float, default=0.0)
    parser.add_argument("--max-len-b", type=int, default=200)
    parser.add_argument("--vocab-selection", metavar="FILE", help="candidates file: ours with vocabulary selection")
    parser.add_argument("--vocab-most-common", type=int, metavar="N", help="the task's --vocab-most-common")
    args = parser.parse_args(argv)

    import torch

    from .generation import GenerationRun, generation_batches, generation_options
    from .models import convs2s_task, translation_task
    from .training import TrainingRun, train_side_by_side, training_batches

    torch.set_num_threads(args.threads)
    task = translation_task(args.data)
    selection_task = convs2s_task(args.data, vocab_selection=args.vocab_selection,
                                  vocab_most_common=args.vocab_most_common) if args.vocab_selection else None
    from fairseq import checkpoint_utils

    (model,), _, _ = checkpoint_utils.load_model_ensemble_and_task([args.checkpoint], task=task)
    if args.phase == "train":
        batches = training_batches(task, args.max_tokens, args.updates)
        from fairseq_convs2s_ext.models.convs2s import ConvS2SModel

        from .models import convs2s_criterion

        criterion = convs2s_criterion(task) if isinstance(model, ConvS2SModel) else None  # as in the timing
        run = TrainingRun("m", model, task, args.precision, args.device, criterion,
                          selection_task and selection_task.vocabulary_selection)
        workload = lambda: train_side_by_side([run], batches)  # noqa: E731
    else:
        batches = generation_batches(task, args.batch_size, limit=args.batches)
        options = generation_options(args.beam, args.max_len_a, args.max_len_b)
        # the plugin's task hands the generator each sentence's candidates
        run = GenerationRun("m", model, selection_task or task, options, args.precision, args.device)
        del model
        workload = lambda: run.translate(batches)  # noqa: E731
    before, peak = measure(workload, args.device)
    json.dump({"before_mib": before, "peak_mib": peak}, sys.stdout)


if __name__ == "__main__":
    main()
