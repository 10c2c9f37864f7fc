"""fairseq fconv vs convs2s: training throughput, generation speed and peak memory.

One run, one table of ratios (ours / fconv), on Multi30k en-de with joint BPE (prepared
into a cache folder on first use, see bench/data.py). Both models have the same
architecture (default fconv_iwslt_de_en) and identical weights: ours is always imported
from fconv with convs2s-import-fconv's conversion.

1. Training: the same batches, initial weights, loss and optimizer (each model with its
   criterion: fairseq's label_smoothed_cross_entropy for fconv, convs2s_cross_entropy for
   ours, both with the demo recipe's smoothing); the models take turns update by update. Target tokens per second, loss curves side by side, and the
   validation loss after the last update.
2. Generation on test_2016_flickr with fairseq's SequenceGenerator (beam 5 and 1,
   batches of 128, every sentence): sentences and tokens per second, whether the
   hypotheses are identical, BLEU. Translates with a trained fconv (--checkpoint, or
   one trained once by fairseq-train into the cache, see bench/reference.py).
3. Peak memory of each workload, each in a process of its own (see bench/memory.py).
4. Operators that compute in a training update and a beam-5 step (bench/operators.py): on a
   GPU each is a kernel launch, which bounds a model of this size.

The machine's measured matrix-multiply GFLOP/s is printed so the fraction of peak can be
read. --quick runs a few updates and sentences (minutes, a smoke test, not a measurement).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sacrebleu
import torch
from convs2s_recipes.score import bleu as sacrebleu_score
from torch.utils.flop_counter import FlopCounterMode

from bench.data import DATASETS, candidates, prepare, test_text
from bench.generation import GenerationRun, generation_batches, generation_options, model_scores, translate_in_turns
from bench.machine import cpu_description, matmul_gflops, native_bf16, source_commit
from bench.operators import count as count_operators
from bench.models import (convs2s_criterion, convs2s_like, convs2s_task, fconv_copy, load_fconv, new_fconv,
                          translation_task)
from bench.reference import reference_checkpoint
from bench.training import SETTINGS, TrainingRun, train_side_by_side, training_batches

REPO = Path(__file__).resolve().parents[1]
SELECTION = "ours, vocabulary selection"
SELECTION_ALONE = "ours, selection, lua softmax"  # over the candidates alone (--vocab-rest-clusters 0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few updates and sentences: a smoke test in minutes")
    p.add_argument("--untrained", action="store_true",
                   help="generate with freshly initialized identical weights instead of the trained reference, "
                        "every output capped at 1.2 x source + 10 tokens (speed only: no BLEU worth reading)")
    p.add_argument("--data", default="demo", choices=sorted(DATASETS),
                   help="demo: the demo recipe's joint BPE 10k; words: word level, every training word "
                        "(see bench/data.py)")
    p.add_argument("--vocab-selection", nargs="?", const="build", metavar="FILE",
                   help="also run ours with vocabulary selection (the candidates FILE, default: built "
                        "from the data's training text with convs2s-align-dict --candidates)")
    p.add_argument("--vocab-most-common", type=int, metavar="N",
                   help="with --vocab-selection: the task's --vocab-most-common (default: the task's, 500)")
    p.add_argument("--arch", default="fconv_iwslt_de_en", help="fconv architecture (ours gets the same layers)")
    p.add_argument("--dropout", type=float, default=SETTINGS.model.dropout, help="default: the demo recipe's")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=2, help="torch threads (CPU)")
    p.add_argument("--low-precision", default=None, choices=["bf16", "fp16", "none"],
                   help="autocast dtype of the extra 'ours' run (default bf16 on a GPU or a CPU with "
                        "native bf16, else none; fp16 needs cuda)")
    p.add_argument("--fconv-gradient-scale", action="store_true",
                   help="give ours fconv's encoder gradient scale 1/(2N) instead of the paper's 1/N: "
                        "then both compute the same gradients and the loss curves coincide")
    p.add_argument("--updates", type=int, default=200, help="timed training updates per model")
    p.add_argument("--warmup", type=int, default=5, help="first updates not timed")
    p.add_argument("--train-bleu", action="store_true",
                   help="after training, translate the test set with each trained model (beam 5; ours with "
                        "vocabulary selection through it) and report BLEU: worth reading after about 1000 updates")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--beams", default="5,1")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3,
                   help="passes over the test set, batch by batch in turns; each batch's best time counts")
    p.add_argument("--checkpoint", help="trained fconv checkpoint for generation (default: the cached reference)")
    p.add_argument("--reference-epochs", type=int, default=5, help="epochs of the reference fconv (trained once, cached)")
    p.add_argument("--skip", default="", help="comma-separated phases to skip: train,operators,generate,memory")
    p.add_argument("--profile", action="store_true", help="print torch.profiler tables of one batch each")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--plots", metavar="DIR", help="also draw the results as PNGs into DIR (bench/plots.py)")
    args = p.parse_args(argv)
    if args.low_precision is None:  # bf16 only where the CPU computes it natively
        args.low_precision = "bf16" if native_bf16(args.device) else "none"
    if args.low_precision == "fp16" and args.device == "cpu":
        p.error("--low-precision fp16 needs --device cuda (CPU autocast: bf16)")
    if args.quick:
        args.updates, args.warmup, args.repeats = min(args.updates, 8), min(args.warmup, 2), 1
    return args


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def train_flops(model, task, sample):
    """Matrix-multiply FLOPs of one training update (forward and backward) of `model`."""
    model.train()
    with FlopCounterMode(display=False) as counter:
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        lprobs.sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def run_training(args, task, lean_task, selection_task, results):
    fconv, fconv_args = new_fconv(task, args.arch, args.dropout)
    ours = convs2s_like(fconv, fconv_args, task)
    runs = [TrainingRun("fconv", fconv, task, "fp32", args.device),
            TrainingRun("ours", ours, task, "fp32", args.device, convs2s_criterion(task))]
    if selection_task is not None:
        runs.append(TrainingRun(SELECTION, convs2s_like(fconv, fconv_args, task), task, "fp32", args.device,
                                convs2s_criterion(task), selection_task.vocabulary_selection))
    if args.low_precision != "none":
        runs.append(TrainingRun(f"ours {args.low_precision}", convs2s_like(fconv, fconv_args, task), task,
                                args.low_precision, args.device, convs2s_criterion(task)))
    if args.fconv_gradient_scale:
        for run in runs[1:]:
            run.model.encoder.gradient_scale /= 2
    batches = training_batches(task, args.max_tokens, args.warmup + args.updates)
    log(f"training {len(runs)} models for {len(batches)} updates each ({args.warmup} untimed)")
    torch.manual_seed(1)
    start = time.time()
    train_side_by_side(runs, batches)
    log(f"  {time.time() - start:.0f} s")
    valid = training_batches(task, args.max_tokens, 5 if args.quick else 10**9, split="valid")
    flops_per_token = train_flops(convs2s_like(fconv, fconv_args, task), task, batches[0]) / batches[0]["ntokens"]
    for run in runs:
        results.setdefault(run.name, {})
        loss, nll = run.validation_loss(valid, task)
        results[run.name]["train tokens/s"] = run.tokens_per_second(args.warmup)
        results[run.name]["train seconds"] = sum(run.times[args.warmup:])
        if run.selection is None:  # the FLOPs counted are the full vocabulary's
            results[run.name]["train GFLOP/s"] = run.tokens_per_second(args.warmup) * flops_per_token / 1e9
        results[run.name]["valid loss"] = loss
        results[run.name]["valid nll"] = nll
        if run.selection is not None:
            results[run.name]["train candidates per batch"] = sum(run.candidates) / len(run.candidates)
    results["loss curves"] = {run.name: run.losses for run in runs}
    if args.train_bleu:
        generation_tasks = {"fconv": task, SELECTION: selection_task}
        batches = generation_batches(task, args.batch_size, limit=1 if args.quick else None)
        for run in runs:
            generation = GenerationRun(run.name, run.model, generation_tasks.get(run.name, lean_task),
                                       generation_options(5), run.precision, args.device)
            generation.translate(batches)
            results[run.name]["BLEU after training"] = bleu(task, generation.hypotheses)


def bleu(task, hypotheses, lang="de"):
    """sacreBLEU of the hypotheses as the recipes score them (BPE removed, detokenized)."""
    return sacrebleu_score(*scored_text(task, hypotheses, lang))["score"]


def scored_text(task, hypotheses, lang="de"):
    """The hypotheses as BLEU reads them (BPE removed, detokenized), and their references."""
    from convs2s_preprocess.stages.tokenize import detokenize

    references = test_text(lang)
    ids = sorted(hypotheses)
    text = [detokenize(task.target_dictionary.string(hypotheses[i], "subword_nmt"), lang) for i in ids]
    return text, [references[i] for i in ids]


def bleu_difference_interval(baseline, system, references, resamples=1000, seed=1):
    """The 95% interval of BLEU(system) - BLEU(baseline) (detokenized text) under paired
    bootstrap resampling of the test sentences: how far the test set can tell the two apart.
    sacreBLEU counts each sentence's n-grams and scores each resample's sums (its paired test
    gives a p-value, which cannot tell "within 0.3 BLEU" from "no difference shown")."""
    metric = sacrebleu.BLEU()

    def statistics(text):  # per sentence: n-gram matches, n-grams, and the two lengths
        scores = [metric.corpus_score([h], [[r]]) for h, r in zip(text, references)]
        return np.array([[*s.counts, *s.totals, s.sys_len, s.ref_len] for s in scores], dtype=np.int64)

    def bleu_of(sums):
        order = metric.max_ngram_order
        return metric.compute_bleu(sums[:order].tolist(), sums[order:2 * order].tolist(), int(sums[-2]),
                                   int(sums[-1]), metric.smooth_method, metric.smooth_value).score

    ours, theirs = statistics(system), statistics(baseline)
    picks = np.random.default_rng(seed).integers(0, len(references), size=(resamples, len(references)))
    differences = [bleu_of(ours[i].sum(0)) - bleu_of(theirs[i].sum(0)) for i in picks]
    return tuple(np.percentile(differences, [2.5, 97.5]))


def run_generation(args, task, lean_task, selection_task, fconv, fconv_args, results):
    limit = 1 if args.quick else None
    batches = generation_batches(task, args.batch_size, limit=limit)
    n = sum(len(b["id"]) for b in batches)
    if selection_task is not None:
        rule = selection_task.vocabulary_selection
        sizes = torch.cat([rule.candidates_per_sentence(b["net_input"]["src_tokens"]).ge(0).sum(1) for b in batches])
        results.setdefault(SELECTION, {})["candidates per sentence"] = sizes.float().mean().item()
        results[SELECTION]["arithmetic ratio"] = arithmetic_ratio(convs2s_like(fconv, fconv_args, task),
                                                                  sizes.float().mean().item())
        alone_task = convs2s_task(selection_task.cfg.data, vocab_selection=selection_task.cfg.vocab_selection,
                                  vocab_most_common=selection_task.cfg.vocab_most_common,
                                  vocab_rest_clusters=0)  # fairseq-lua's softmax over the candidates alone
    for beam in [int(b) for b in args.beams.split(",")]:
        options = generation_options(beam, *((1.2, 10) if args.quick or args.untrained else ()))
        # ours with fairseq's own SequenceGenerator, and with convs2s_translation's lean beam step
        runs = [GenerationRun("fconv", fconv_copy(fconv, fconv_args, task), task, options, "fp32", args.device),
                GenerationRun("ours, stock search", convs2s_like(fconv, fconv_args, task), task, options, "fp32",
                              args.device),
                GenerationRun("ours", convs2s_like(fconv, fconv_args, task), lean_task, options, "fp32",
                              args.device)]
        if selection_task is not None:
            runs.append(GenerationRun(SELECTION, convs2s_like(fconv, fconv_args, task), selection_task, options,
                                      "fp32", args.device))
            runs.append(GenerationRun(SELECTION_ALONE, convs2s_like(fconv, fconv_args, task), alone_task, options,
                                      "fp32", args.device))
        if args.low_precision != "none":
            runs.append(GenerationRun(f"ours {args.low_precision}", convs2s_like(fconv, fconv_args, task), lean_task,
                                      options, args.low_precision, args.device))
        log(f"generating {n} sentences at beam {beam}, {args.repeats} passes per model")
        best = translate_in_turns(runs, batches, args.repeats)
        reference = runs[0].hypotheses
        fconv_text, references = scored_text(task, reference)
        fconv_scores = model_scores(runs[0].model, task, batches, reference)
        for run in runs:
            r = results.setdefault(run.name, {})
            r[f"beam {beam} sentences/s"] = n / best[run.name]
            r[f"beam {beam} tokens/s"] = run.generated_tokens() / best[run.name]
            r[f"beam {beam} identical"] = sum(torch.equal(reference[i], run.hypotheses[i]) for i in reference)
            text = scored_text(task, run.hypotheses)[0]
            r[f"beam {beam} BLEU"] = sacrebleu_score(text, references)["score"]
            if r[f"beam {beam} identical"] < n:  # whether it differs from fconv's by more than the test set can tell
                low, high = bleu_difference_interval(fconv_text, text, references)
                r[f"beam {beam} BLEU - fconv's, 95% from"], r[f"beam {beam} BLEU - fconv's, 95% to"] = low, high
                scores = model_scores(runs[0].model, task, batches, run.hypotheses)
                r[f"beam {beam} score deficit"] = sum(fconv_scores[i] - scores[i] for i in reference) / n
        results["sentences"] = n


def arithmetic_ratio(model, candidates):
    """fconv's multiply-adds per hypothesis and decoder step over ours with vocabulary
    selection as it generates (``model``, freshly converted, is prepared for generation
    here): ours has no attention projections per step (they move onto the source, once per
    sentence), no first convolution (looked up per word), fc2 folded into the output layer,
    and ``candidates`` output words. Left out of both: the attention's products with the
    source, and ours' projections of it and products of the first convolution with each
    word met, a few percent."""
    decoder = model.decoder

    def multiply_adds(modules):
        return sum(m.in_features * m.out_features for m in modules if isinstance(m, torch.nn.Linear))

    full = multiply_adds(decoder.modules())
    model.make_generation_fast_()
    attention = {m for layer in decoder.attention if layer is not None for m in layer.modules()}
    not_per_step = {decoder.convolutions[0].linear, decoder.output_projection}  # looked up; the candidates instead
    per_step = multiply_adds(m for m in decoder.modules() if m not in attention and m not in not_per_step)
    return full / (per_step + candidates * decoder.output_projection.in_features)


def memory(args, data_bin, phase, checkpoint, precision, beam=5, vocab_selection=None):
    command = [sys.executable, "-m", "bench.memory", phase, str(checkpoint), "--data", str(data_bin),
               "--precision", precision, "--device", args.device, "--threads", str(args.threads),
               "--max-tokens", str(args.max_tokens), "--updates", str(2 if args.quick else 10),
               "--beam", str(beam), "--batch-size", str(args.batch_size)]
    if args.quick:
        command += ["--batches", "1", "--max-len-a", "1.2", "--max-len-b", "10"]
    if vocab_selection:
        command += ["--vocab-selection", str(vocab_selection)]
        if args.vocab_most_common is not None:
            command += ["--vocab-most-common", str(args.vocab_most_common)]
    # glibc returns every freed block of 64 KiB or more to the OS at once: the peak is then
    # what the workload holds, not where its heap's layout left freed blocks (without this,
    # two runs of the same workload differed by 300 MiB).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        log(f"  failed: {' '.join(command)}\n" + "\n".join(out.stderr.splitlines()[-5:]))
        return None
    m = json.loads(out.stdout)
    return m["peak_mib"] - m["before_mib"]


def run_memory(args, data_bin, task, fconv, fconv_args, results):
    from fairseq.checkpoint_utils import torch_persistent_save

    from fairseq_convs2s_ext.checkpoints.fconv_import import convert_checkpoint

    fresh, fresh_args = new_fconv(task, args.arch, args.dropout)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for phase, model, model_args in (("train", fresh, fresh_args), ("generate", fconv, fconv_args)):
            state = {"args": model_args, "model": model.state_dict(), "last_optimizer_state": None,
                     "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                            "optimizer_name": "FairseqNAG", "lr_scheduler_state": {},
                                            "num_updates": 0}],
                     "extra_state": {"train_iterator": {"epoch": 1}}}
            paths[phase, "fconv"] = os.path.join(tmp, f"{phase}-fconv.pt")
            paths[phase, "ours"] = os.path.join(tmp, f"{phase}-ours.pt")
            torch_persistent_save(state, paths[phase, "fconv"])
            converted = convert_checkpoint(state, task.source_dictionary, task.target_dictionary)
            torch_persistent_save(converted, paths[phase, "ours"])
        for phase in ("train", "generate"):
            log(f"peak memory: {phase}")
            names = [("fconv", "fconv", "fp32"), ("ours", "ours", "fp32")]
            if args.vocab_selection:
                names.append((SELECTION, "ours", "fp32"))
            if args.low_precision != "none":
                names.append((f"ours {args.low_precision}", "ours", args.low_precision))
            for name, model, precision in names:
                selection = args.vocab_selection if name == SELECTION else None
                results.setdefault(name, {})[f"{phase} peak MiB"] = memory(args, data_bin, phase, paths[phase, model],
                                                                           precision, vocab_selection=selection)


def profile(args, task, lean_task, selection_task, fconv, fconv_args):
    """torch.profiler tables: one training update and one beam-5 batch of each model (ours
    with the lean beam step, and with vocabulary selection if asked for)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    sample = training_batches(task, args.max_tokens, 1)[0]
    batch = generation_batches(task, args.batch_size, limit=2)[1]
    copies = {"fconv": lambda: fconv_copy(fconv, fconv_args, task), "ours": lambda: convs2s_like(fconv, fconv_args, task)}
    variants = [("fconv", "fconv", "fp32", task), ("ours", "ours", "fp32", lean_task)]
    if selection_task is not None:
        variants.append((SELECTION, "ours", "fp32", selection_task))
    if args.low_precision != "none":
        variants.append((f"ours {args.low_precision}", "ours", args.low_precision, lean_task))
    for name, model, precision, generation_task in variants:
        run = TrainingRun(name, copies[model](), task, precision, args.device,
                          convs2s_criterion(task) if model == "ours" else None,
                          getattr(generation_task, "vocabulary_selection", None))
        run.update(sample)
        with torch_profile(activities=activities) as prof:
            run.update(sample)
        print(f"\n== training update, {name} ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        gen = GenerationRun(name, copies[model](), generation_task, generation_options(5), precision, args.device)
        gen.translate([batch])
        with torch_profile(activities=activities) as prof:
            gen.translate([batch])
        print(f"\n== beam 5, {len(batch['id'])} sentences, {name} ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def print_table(args, results, machine):
    names = [n for n in results if isinstance(results[n], dict) and n != "loss curves"]
    metrics = []
    for name in names:
        metrics += [m for m in results[name] if m not in metrics]
    print(f"\nmachine: {machine['device']}, {args.threads} threads; torch.mm {machine['n']}^3: "
          f"fp32 {machine['fp32 GFLOP/s']:.0f} GFLOP/s, bf16 {machine['bf16 GFLOP/s']:.0f} GFLOP/s")
    data = {"demo": "Multi30k en-de as `make demo` prepares it", "words": "word-level Multi30k en-de"}[args.data]
    print(f"arch {args.arch}, {data} (dictionaries {results['dictionaries']}); training: {args.updates} timed updates of "
          f"{args.max_tokens} tokens; generation: {results.get('sentences', '-')} sentences, batch {args.batch_size}"
          + ("  [QUICK: smoke test, not a measurement]" if args.quick else ""))
    if "selection" in results:
        print(f"vocabulary selection: {results['selection']}")
    header = ["metric"] + [n for n in names] + [f"{n} / fconv" for n in names if n != "fconv"]
    rows = []
    for metric in metrics:
        row = [metric]
        for name in names:
            v = results[name].get(metric)
            row.append("-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
        for name in names[1:]:
            a, b = results[name].get(metric), results["fconv"].get(metric)
            row.append(f"{a / b:.3f}" if isinstance(a, (int, float)) and b else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if any("train GFLOP/s" in results[n] for n in names):
        print("train GFLOP/s as a fraction of torch.mm's: " + ", ".join(
            f"{n} {results[n]['train GFLOP/s'] / machine[('bf16' if 'bf16' in n else 'fp32') + ' GFLOP/s']:.0%}"
            for n in names if "train GFLOP/s" in results[n]))
    if "loss curves" in results:
        curves = results["loss curves"]
        every = max(1, len(next(iter(curves.values()))) // 10)
        print("\ntraining loss (label-smoothed, bits per target token), mean over the last updates:")
        print("update  " + "  ".join(f"{n:>12}" for n in curves))
        length = len(next(iter(curves.values())))
        for end in range(every, length + 1, every):
            print(f"{end:6d}  " + "  ".join(f"{sum(c[end - every:end]) / every:12.4f}" for c in curves.values()))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    data_bin = prepare(args.data)
    task = translation_task(data_bin)
    if args.vocab_selection == "build":
        args.vocab_selection = str(candidates(args.data))
    lean_task = convs2s_task(data_bin)  # ours translates with the lean beam step
    selection_task = convs2s_task(data_bin, vocab_selection=args.vocab_selection,
                                  vocab_most_common=args.vocab_most_common) if args.vocab_selection else None
    machine = {"device": torch.cuda.get_device_name() if args.device == "cuda" else cpu_description(),
               "n": 2048, "fp32 GFLOP/s": matmul_gflops(torch.float32, args.device),
               "bf16 GFLOP/s": matmul_gflops(torch.bfloat16, args.device) if native_bf16(args.device) else 0.0}
    low = f"ours {args.low_precision}"
    results = {"fconv": {}, "ours": {}, **({low: {}} if args.low_precision != "none" else {}),
               "dictionaries": f"{len(task.source_dictionary)} / {len(task.target_dictionary)}"}
    if selection_task is not None:
        cfg = selection_task.cfg
        results["selection"] = (f"--vocab-most-common {cfg.vocab_most_common} --vocab-top-aligned "
                                f"{cfg.vocab_top_aligned} --vocab-rest-clusters {cfg.vocab_rest_clusters}")

    commit = source_commit()

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"commit": commit, "command": " ".join(["python -m bench.benchmark", *sys.argv[1:]]),
                           "args": vars(args), "machine": machine, "results": results}, f, indent=1)

    try:  # a failing phase still leaves the table of the others
        if "train" not in skip:
            run_training(args, task, lean_task, selection_task, results)
            save()
        if "operators" not in skip:  # what bounds a GPU at this size: kernel launches
            fresh, fresh_args = new_fconv(task, args.arch, args.dropout)
            for name, row in count_operators(task, lean_task, fresh, fresh_args, args.max_tokens).items():
                results.setdefault(name, {}).update(row)
            save()
        if not {"generate", "memory"} <= skip or args.profile:
            if args.checkpoint:
                fconv, fconv_args = load_fconv(args.checkpoint, task)
            elif args.quick or args.untrained:
                fconv, fconv_args = new_fconv(task, args.arch, args.dropout)
            else:
                fconv, fconv_args = load_fconv(reference_checkpoint(data_bin, args.arch, args.reference_epochs), task)
            if args.profile:
                profile(args, task, lean_task, selection_task, fconv, fconv_args)
            if "generate" not in skip:
                run_generation(args, task, lean_task, selection_task, fconv, fconv_args, results)
                save()
            if "memory" not in skip:
                run_memory(args, data_bin, task, fconv, fconv_args, results)
    finally:
        # the best of a measurement before and after: the machine is shared (bf16 only where
        # it is native: emulated, one 2048^3 product takes about a minute)
        for dtype in ("fp32", "bf16") if native_bf16(args.device) else ("fp32",):
            again = matmul_gflops(torch.float32 if dtype == "fp32" else torch.bfloat16, args.device)
            machine[f"{dtype} GFLOP/s"] = max(machine[f"{dtype} GFLOP/s"], again)
        save()
        print_table(args, results, machine)
        if args.plots:
            from bench.plots import render

            record = {"args": vars(args), "machine": machine, "results": results}
            log("plots: " + ", ".join(str(p) for p in render([record], args.plots)))

if __name__ == "__main__":
    main()
