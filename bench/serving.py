"""Ours against what a user would serve instead: CTranslate2 serving a fairseq Transformer of
the same size class (issue 53), on the same machine and threads, in one run.

    python -m bench.serving                      # 15 minutes of training each, then the table
    python -m bench.serving --quick              # a smoke run (minutes; no figures)
    python -m bench.serving --quality CKPT [--split valid]  # ours float32 against int8 alone

**The models.** All three trained by ``fairseq-train`` on the demo's data (Multi30k en-de, joint
BPE 10k, bench/data.py) for the same wall time (``--train-minutes``, fairseq's
``--stop-time-hours``), with ``--threads`` threads, once, cached under bench's cache folder
(keyed by the data's bytes, the recipe and the minutes; a killed run resumes):

- the peer: fairseq's ``transformer`` with :data:`TRANSFORMER_RECIPE`, fixed: 3 + 3 layers,
  256 dimensions, FFN 1024, 4 heads, the decoder's input and output embeddings shared;
  dropout 0.1 and :data:`SHORT_BUDGET` training: Adam (0.9, 0.98) at 1e-3 with inverse-sqrt
  warm-up over 400 updates (the demo's 15 minutes are 350-700 updates on 2 cores), label
  smoothing 0.1, 4000 tokens;
- ours: ``convs2s_iwslt_de_en`` (4 + 3 layers of 256), dropout 0.2 (the architecture's), the
  same :data:`SHORT_BUDGET` training. The paper's NAG at 0.25 with clipping at 0.1 is made
  for days of training: after the same 550 updates (12 minutes) it reached validation loss
  6.20 and sacreBLEU 20.8 on test_2016_flickr, Adam 5.77 and 26.3 (docs/performance.md);
- fconv: fairseq's ``fconv_iwslt_de_en``, dropout 0.2, the same training, as a row.

The Transformer is converted by CTranslate2's fairseq converter to float32 and int8.

**The runs.** All 1000 sentences of test_2016_flickr (BPE as prepared), beam 5, batches of 128
sentences (CTranslate2's ``max_batch_size``), ``--threads`` threads, each system in a process
of its own, the systems taking turns to translate the whole set, ``--repeats`` times, each
system's best time counting: CTranslate2 float32 and int8; fairseq's
SequenceGenerator (what fairseq-generate runs, through ``task.inference_step``) over the
Transformer, fconv, ours float32 and ours int8 (``--quantize int8``); and with the target
vocabulary narrowed by the same alignment candidates (bench.data's, ``convs2s-align-dict
--candidates`` on the training text; the task's defaults, 500 most common words and 100 aligned
words a source word): CTranslate2 int8 with a vocabulary map made from them
(:func:`vocabulary_map`) and ours int8 with ``--vocab-selection``. Twice:

- as trained: up to 200 tokens (fairseq-generate's default, CTranslate2's
  ``max_decoding_length``); sentences and target tokens per second, sacreBLEU (detokenized),
  and for each int8 system the 95% interval of its BLEU difference from its float32 self under
  paired bootstrap resampling of the sentences (bench.benchmark's);
- at equal work: every hypothesis ``--forced-length`` words and ``</s>``, a decoder step each
  (fairseq's ``--min-len`` and ``--max-len-b`` with ``--max-len-a 0``); CTranslate2, which
  takes no step for ``</s>`` at its ``max_decoding_length``, ``--forced-length`` + 1 words
  (its ``min_decoding_length`` and ``max_decoding_length``).

**CTranslate2's threads.** ``--threads`` threads are CTranslate2's ``inter_threads``
(translators working on batches of their own, side by side) times ``intra_threads`` (threads a
translator). Its systems take a translator a thread (as the example of CTranslate2's
documentation on parallel execution, docs/parallel.md there, takes 4 workers of 1 thread: the
batches of one ``translate_batch`` call go to the translators side by side); "CTranslate2 int8,
one translator" is the same int8 model with one translator of ``--threads`` threads, as a row.
On 2 cores, int8, at equal work, a translator a thread translated 1.2-1.4x as many sentences a
second as one translator of two (Intel Xeon with AVX-512 VNNI, and held to AVX2:
docs/performance.md). The systems of fairseq (ours among them) run one process of ``--threads``
threads; "ours int8, a process a thread" (:class:`ProcessesSystem`) is ours int8 split as
CTranslate2 is, into ``--threads`` processes of one thread each, the batches shared out as
``convs2s-translate --workers`` shares them, and so is ours with vocabulary selection.

Ratios are against CTranslate2 int8 (a translator a thread); the machine (bench/machine.py) is
printed beside the table. Run it alone on the machine (bench/README.md).
"""
import argparse
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from convs2s_recipes.score import bleu as sacrebleu_score
from convs2s_serving.int8_linear import PRODUCT_ENV

import fairseq_convs2s_ext
from bench.data import cache_root, candidates, prepare, test_text
from bench.generation import GenerationRun, generation_batches
from bench.machine import cpu_description, matmul_gflops, source_commit
from bench.models import convs2s_task, load_fconv, translation_task
from bench.reference import data_fingerprint

USER_DIR = str(Path(fairseq_convs2s_ext.__file__).parent)
# The training of every model of the comparison, a Transformer's usual recipe for a short run:
# the optimizer and its schedule, then the criterion (its name is the model's).
SHORT_BUDGET = [
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "400", "--warmup-init-lr", "1e-07",
]


def short_budget(criterion):
    return [*SHORT_BUDGET, "--criterion", criterion, "--label-smoothing", "0.1", "--max-tokens", "4000"]


TRANSFORMER_RECIPE = [
    "--arch", "transformer", "--encoder-layers", "3", "--decoder-layers", "3",
    "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
    "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-decoder-input-output-embed",
    "--dropout", "0.1", *short_budget("label_smoothed_cross_entropy"),
]
FCONV_RECIPE = ["--arch", "fconv_iwslt_de_en", "--dropout", "0.2", *short_budget("label_smoothed_cross_entropy")]
OURS_RECIPE = ["--arch", "convs2s_iwslt_de_en", "--task", "convs2s_translation", "--dropout", "0.2",
               *short_budget("convs2s_cross_entropy")]
PEER = "CTranslate2 int8"
ONE_TRANSLATOR = f"{PEER}, one translator"  # of --threads threads, where the peer takes a translator a thread
PROCESSES = "ours int8, a process a thread"  # --threads processes (convs2s-translate --workers)
SELECTION = "ours int8, vocabulary selection"
COMPILED = "ours exported, int8, compiled"  # convs2s-serve --compile: its programs compiled by AOTInductor
COMPILED_SELECTION = f"{COMPILED}, vocabulary selection"  # exported with --vocab-selection
# The systems of ours split into --threads processes of a thread, and the system each runs.
SPLIT = {PROCESSES: "ours int8", f"{SELECTION}, a process a thread": SELECTION,
         f"{COMPILED}, a process a thread": COMPILED,
         f"{COMPILED_SELECTION}, a process a thread": COMPILED_SELECTION}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-minutes", type=float, default=15.0, help="wall time each model trains (default 15)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every system, and of training")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--forced-length", type=int, default=16,
                        help="words of every hypothesis at equal work, then </s> (CTranslate2: a word more)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the test set per system; the best counts")
    parser.add_argument("--batches", type=int, default=None,
                        help="translate only N batches, spread over the lengths (bench.generation)")
    parser.add_argument("--systems", type=lambda text: [name.strip() for name in text.split(";")], default=None,
                        help="only these systems, separated by ';' (the peer, " + PEER + ", always runs)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--quality", metavar="CHECKPOINT",
                        help="only ours float32 against ours int8 with this trained convs2s checkpoint (of the "
                             "demo's data): sacreBLEU of each and the interval of their difference")
    parser.add_argument("--split", choices=("test", "valid"), default="test",
                        help="with --quality: test_2016_flickr, or Multi30k's validation set (1014 sentences; "
                             "fairseq-train only reports its loss, it never trains on it)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 0.5 minutes of training, one batch of 16, one pass")
    args = parser.parse_args(argv)
    if args.systems is not None:
        unknown = [name for name in args.systems if name not in SYSTEMS]
        if unknown:
            parser.error(f"--systems: no system {unknown[0]!r}; the systems are: {'; '.join(SYSTEMS)}")
        args.systems = [name for name in SYSTEMS if name == PEER or name in args.systems]
    if args.quick:
        args.train_minutes, args.batches, args.batch_size, args.repeats = 0.5, 1, 16, 1
    return args


def log(*message):
    print(*message, file=sys.stderr, flush=True)


def trained(name, data_bin, recipe, minutes, threads):
    """checkpoint_last.pt of ``recipe`` trained by fairseq-train for ``minutes`` of wall time,
    once: cached by the data's bytes, the recipe and the minutes; a killed run resumes."""
    key = hashlib.sha256(" ".join(recipe).encode()).hexdigest()[:8]
    save_dir = cache_root() / f"serving-{name}-{data_fingerprint(data_bin)}-{key}-{minutes:g}min"
    if (save_dir / "done").exists():
        return save_dir / "checkpoint_last.pt"
    log(f"training {name} for {minutes:g} minutes (fairseq-train) into {save_dir}")
    subprocess.run([sys.executable, "-m", "fairseq_cli.train", str(data_bin), "--user-dir", USER_DIR, *recipe,
                    "--stop-time-hours", str(minutes / 60), "--seed", "1", "--save-dir", str(save_dir),
                    "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "simple", "--log-interval", "50"],
                   check=True, stdout=sys.stderr,  # the tables alone on stdout
                   env={**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    (save_dir / "done").touch()
    return save_dir / "checkpoint_last.pt"


def converted(checkpoint, data_bin, quantization, vmap=None):
    """The CTranslate2 model of a fairseq Transformer checkpoint, converted once (with the
    vocabulary map ``vmap``, a file, if given). The plugin, imported, lets torch's safe
    unpickler read fairseq's checkpoints."""
    from ctranslate2.converters import FairseqConverter

    out = checkpoint.parent / f"ctranslate2-{quantization}{'-vmap-' + file_digest(vmap) if vmap else ''}"
    if not (out / "model.bin").exists():
        FairseqConverter(str(checkpoint), str(data_bin), source_lang="en", target_lang="de").convert(
            str(out), vmap=vmap and str(vmap), quantization=quantization, force=True)
    return out


def file_digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def vocabulary_map(selection, src_dict, tgt_dict, path):
    """CTranslate2's vocabulary map holding the candidates of ``selection`` (the plugin's
    :class:`VocabularySelection`, read from our candidates file): each source word's aligned
    target words, and under the empty key the words every sentence has (the most common).
    CTranslate2 takes the union over a batch where ours takes each sentence's own; its
    ``<unk>``, ``<s>`` and ``</s>`` are always candidates, as ours are."""
    pad = tgt_dict.pad()
    lines = ["\t" + " ".join(tgt_dict[t] for t in selection.always.tolist() if t >= tgt_dict.nspecial)]
    for s, word in enumerate(src_dict.symbols):  # the table has a row for every source id
        targets = [tgt_dict[t] for t in selection.aligned[s].tolist() if t != pad]
        if s >= src_dict.nspecial and targets:
            lines.append(f"{word}\t{' '.join(targets)}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def detokenized(bpe_text):
    from convs2s_preprocess.stages.tokenize import detokenize

    return detokenize((bpe_text + " ").replace("@@ ", "").rstrip(), "de")


class CTranslate2System:
    """A CTranslate2 ``Translator`` (its translators side by side), ``compute_type`` as
    converted, on the BPE'd source lines."""

    def __init__(self, name, model_dir, compute_type, args, sources, use_vmap=False, translators=None):
        """``translators`` of ``args.threads // translators`` threads each; by default a
        translator a thread (the module's "CTranslate2's threads")."""
        import ctranslate2

        self.name, self.args, self.sources, self.use_vmap = name, args, sources, use_vmap
        translators = translators or args.threads
        self.translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                                                 inter_threads=translators,
                                                 intra_threads=max(1, args.threads // translators))

    def translate(self, forced):
        """At equal work, as many decoder steps as fairseq's generator takes: it writes
        ``forced`` words and scores ``</s>`` at a step of its own, where CTranslate2 stops at
        ``max_decoding_length`` without one (its hypotheses then end without ``</s>``); so
        CTranslate2 writes ``forced`` + 1 words. Tokens count the steps: as trained, a
        hypothesis's words and its ``</s>``, which CTranslate2 leaves out of the result."""
        lengths = dict(min_decoding_length=forced + 1, max_decoding_length=forced + 1) if forced else {
            "max_decoding_length": 200}
        start = time.perf_counter()
        results = self.translator.translate_batch(self.sources, beam_size=self.args.beam, use_vmap=self.use_vmap,
                                                  max_batch_size=self.args.batch_size, **lengths)
        seconds = time.perf_counter() - start
        tokens = [r.hypotheses[0] for r in results]
        return seconds, [" ".join(t) for t in tokens], sum(len(t) + (0 if forced else 1) for t in tokens)


class FairseqSystem:
    """fairseq's SequenceGenerator over one model, through its task (bench.generation). The
    model is prepared once, as fairseq-generate prepares it (a prepared model cannot be
    prepared again: fairseq's ``make_generation_fast_`` replaces its ``train``); each length
    setting gets a generator of its own."""

    def __init__(self, name, model, task, args, batches):
        self.name, self.task, self.args, self.batches = name, task, args, batches
        self.run = GenerationRun(name, model, task, self.options(None))
        self.generators = {None: self.run.generator}

    def options(self, forced):
        return argparse.Namespace(beam=self.args.beam, max_len_a=0, max_len_b=forced or 200, min_len=forced or 1,
                                  lenpen=1.0, unkpen=0.0, nbest=1)

    def translate(self, forced, which=None):
        """The batches (``which``: those of these numbers) translated, ``forced`` words a
        hypothesis if given; (seconds, their hypotheses in sentence order, tokens)."""
        if forced not in self.generators:
            self.generators[forced] = self.task.build_generator([self.run.model], self.options(forced))
        self.run.generator, self.run.hypotheses = self.generators[forced], {}
        seconds = self.run.translate(self.batches if which is None else [self.batches[i] for i in which])
        ids = sorted(self.run.hypotheses)
        text = [self.task.target_dictionary.string(self.run.hypotheses[i]) for i in ids]
        return seconds, text, self.run.generated_tokens()


class ExportedSystem:
    """Ours exported by ``convs2s-export`` (exported afresh when the system is built, not
    timed; ``quantize`` float32 or int8, as ``--quantize``; with vocabulary selection from
    ``candidates``, the task's other selection options, as ``--vocab-selection``) and
    beam-searched by ``convs2s_serving``, torch alone, over the same batches as fairseq's."""

    def __init__(self, name, checkpoint, data_bin, args, batches, quantize="float32", compile=False,
                 candidates=None):
        import tempfile

        from convs2s_serving import ExportedModel

        from fairseq_convs2s_ext.generation.export import export
        from fairseq_convs2s_ext.generation.quantization import quantize_

        self.name, self.args, self.batches = name, args, batches
        self.folder = tempfile.TemporaryDirectory(prefix="convs2s-exported-")
        task = convs2s_task(data_bin, vocab_selection=candidates)
        model = fairseq_model(checkpoint, task)
        model.make_generation_fast_(need_attn=False)
        if quantize == "int8":
            quantize_([model])
        task.estimate_rest([model])
        export(model, Path(self.folder.name) / "model", selection=task.vocabulary_selection)
        self.model = ExportedModel(Path(self.folder.name) / "model", compile=compile)  # compiled: not timed

    def translate(self, forced, which=None):
        from convs2s_serving import SearchOptions, beam_search

        options = SearchOptions(beam=self.args.beam, max_len_b=forced or 200, min_len=forced or 1)
        found = {}
        start = time.perf_counter()
        with torch.inference_mode():
            for batch in self.batches if which is None else [self.batches[i] for i in which]:
                hypotheses = beam_search(self.model, batch["net_input"]["src_tokens"], options)
                found.update((i, h[0].tokens) for i, h in zip(batch["id"].tolist(), hypotheses))
        seconds = time.perf_counter() - start
        ids = sorted(found)
        return (seconds, [" ".join(self.model.target_words(found[i])) for i in ids],
                sum(len(found[i]) for i in ids))


def fairseq_model(checkpoint, task):
    from fairseq import checkpoint_utils

    (model,), _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], task=task)
    return model


def sentences_to_translate(task, args, data_bin, split="test"):
    """The batches to translate, their sentence ids (sorted) and BPE'd source lines (in that order)."""
    batches = generation_batches(task, args.batch_size, split=split, limit=args.batches)
    ids = sorted(i for batch in batches for i in batch["id"].tolist())
    lines = (data_bin / f"{split}.en-de.en").read_text(encoding="utf-8").splitlines()
    return batches, ids, [lines[i].split() for i in ids]


@dataclass(frozen=True)
class Models:
    """What the systems are built from: the three trained checkpoints, our candidates file and
    the vocabulary map made from it (CTranslate2's)."""
    transformer: Path
    convs2s: Path
    fconv: Optional[Path]
    candidates: Optional[Path]
    vmap: Optional[Path]


SYSTEMS = ("CTranslate2 float32", PEER, ONE_TRANSLATOR, "fairseq, Transformer", "fconv", "ours float32",
           "ours int8", PROCESSES, f"{PEER}, vocabulary map", SELECTION, f"{SELECTION}, a process a thread",
           "ours exported, float32", "ours exported, int8", COMPILED, f"{COMPILED}, a process a thread",
           COMPILED_SELECTION, f"{COMPILED_SELECTION}, a process a thread")


def trained_models(args, data_bin, systems=SYSTEMS):
    """The models of the comparison, trained (or taken from the cache): the Transformer and ours
    always, fconv where ``systems`` include it; and the vocabulary map."""
    transformer = trained("transformer", data_bin, TRANSFORMER_RECIPE, args.train_minutes, args.threads)
    ours = trained("convs2s", data_bin, OURS_RECIPE, args.train_minutes, args.threads)
    fconv = trained("fconv", data_bin, FCONV_RECIPE, args.train_minutes, args.threads) if "fconv" in systems else None
    candidates_file = candidates("demo")
    selection = convs2s_task(data_bin, vocab_selection=candidates_file).vocabulary_selection
    task = translation_task(data_bin)
    vmap = vocabulary_map(selection, task.source_dictionary, task.target_dictionary, transformer.parent / "vmap.txt")
    return Models(transformer, ours, fconv, candidates_file, vmap)


def build_system(name, models, args, data_bin):
    """The system ``name`` (one of :data:`SYSTEMS`), its models loaded."""
    task = translation_task(data_bin)
    batches, _, sources = sentences_to_translate(task, args, data_bin)
    if name.startswith("CTranslate2"):
        quantization = "float32" if name.endswith("float32") else "int8"
        vmap = models.vmap if name.endswith("vocabulary map") else None
        return CTranslate2System(name, converted(models.transformer, data_bin, quantization, vmap), quantization,
                                 args, sources, use_vmap=vmap is not None,
                                 translators=1 if name == ONE_TRANSLATOR else None)
    if name == "fairseq, Transformer":
        return FairseqSystem(name, fairseq_model(models.transformer, task), task, args, batches)
    if name == "fconv":
        return FairseqSystem(name, load_fconv(models.fconv, task)[0], task, args, batches)
    if name.startswith("ours exported"):
        return ExportedSystem(name, models.convs2s, data_bin, args, batches, quantize=name.split(", ")[1],
                              compile=name.startswith(COMPILED),
                              candidates=models.candidates if name == COMPILED_SELECTION else None)
    options = {"ours float32": {}, "ours int8": dict(quantize="int8"),
               SELECTION: dict(vocab_selection=models.candidates, quantize="int8")}[name]
    ours_task = convs2s_task(data_bin, **options)
    return FairseqSystem(name, fairseq_model(models.convs2s, ours_task), ours_task, args, batches)


def measure(runs, repeats, forced, sentences):
    """Each system translates the test set in turn, ``repeats`` times; its best time counts."""
    results = {run.name: {"seconds": float("inf")} for run in runs}
    for _ in range(repeats):
        for run in runs:
            seconds, text, tokens = run.translate(forced)
            result = results[run.name]
            if seconds < result["seconds"]:
                result.update(seconds=seconds, text=text, tokens=tokens)
    for result in results.values():
        result["sentences/s"] = sentences / result["seconds"]
        result["tokens/s"] = result["tokens"] / result["seconds"]
        result["mean length"] = result["tokens"] / sentences
    return results


class SystemProcess:
    """The system ``name`` (:func:`build_system`) in a spawned process of its own, which
    translates when asked (``translate`` as the systems'), until ``close``."""

    def __init__(self, name, models, args, data_bin):
        self.name = name
        self.process = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=_build_here, initargs=(name, models, args, data_bin))
        self.process.submit(int).result()  # built (or its error raised) before any pass is timed

    def translate(self, forced, which=None):
        return self.process.submit(_translate_here, forced, which).result()

    def close(self):
        self.process.shutdown()


_SYSTEM = None  # in a SystemProcess's process: its system


def _build_here(name, models, args, data_bin, built=None):
    global _SYSTEM
    torch.set_num_threads(args.threads)
    _SYSTEM = build_system(name, models, args, data_bin)
    if built is not None:
        built.wait()  # until every process of the pool has its system


def _translate_here(forced, which):
    return _SYSTEM.translate(forced) if which is None else _SYSTEM.translate(forced, which)


class ProcessesSystem:
    """Ours (:data:`SPLIT`: int8, or int8 with vocabulary selection) in ``--threads``
    processes of one thread each, each holding the system, each batch handed to whichever
    process is free, the longest first, as ``convs2s-translate --workers`` shares its batches
    out (fairseq_convs2s_ext/models/hub_workers.py: one pool, every batch submitted at once,
    so that a process finds its next batch queued when it finishes one); the time is the
    whole set's, taken here (the messages between the processes counted)."""

    def __init__(self, name, models, args, data_bin):
        self.name = name
        one_thread = argparse.Namespace(**{**vars(args), "threads": 1})
        spawn = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(args.threads, mp_context=spawn, initializer=_build_here,
                                        initargs=(SPLIT[name], models, one_thread, data_bin, spawn.Barrier(args.threads)))
        for started in [self.pool.submit(int) for _ in range(args.threads)]:  # built before any pass is timed
            started.result()
        batches, _, _ = sentences_to_translate(translation_task(data_bin), args, data_bin)
        self.ids = [sorted(batch["id"].tolist()) for batch in batches]

    def translate(self, forced):
        longest_first = list(reversed(range(len(self.ids))))
        start = time.perf_counter()
        done = list(self.pool.map(_translate_here, [forced] * len(longest_first), [[i] for i in longest_first]))
        seconds = time.perf_counter() - start
        text = {}
        for i, (_, batch_text, _) in zip(longest_first, done):
            text.update(zip(self.ids[i], batch_text))
        return seconds, [text[i] for i in sorted(text)], sum(tokens for _, _, tokens in done)

    def close(self):
        self.pool.shutdown()


def measure_each_alone(names, models, args, data_bin, sentences, each_phase=None):
    """:func:`measure` with each system in a process of its own (:class:`SystemProcess`), as
    trained and at equal work: {phase: {name: result}}, each phase also handed to
    ``each_phase(phase, results)`` as it ends (a run of an hour shows its first table half-way).
    The systems still take turns pass by pass, so a change in the machine's speed reaches all
    of them alike, but no two share a process: CTranslate2 has an OpenMP runtime of its own
    beside torch's, and a server runs one system, not eight."""
    runs, results = [], {}
    try:
        for name in names:
            log(f"starting {name} in a process of its own")
            system = ProcessesSystem if name in SPLIT else SystemProcess
            runs.append(system(name, models, args, data_bin))
        for phase, forced in (("as trained", None), ("equal work", args.forced_length)):
            results[phase] = measure(runs, args.repeats, forced, sentences)
            if each_phase is not None:
                each_phase(phase, results[phase])
        return results
    finally:
        for run in runs:
            run.close()


def score(results, references):
    """sacreBLEU of each system, and each int8 system's 95% interval against its float32 self."""
    from bench.benchmark import bleu_difference_interval

    text = {name: [detokenized(t) for t in result["text"]] for name, result in results.items()}
    for name, result in results.items():
        result["BLEU"] = sacrebleu_score(text[name], references)["score"]
    for int8, baseline in ((PEER, "CTranslate2 float32"), ("ours int8", "ours float32"),
                           *((split, "ours float32") for split in SPLIT),
                           (f"{PEER}, vocabulary map", "CTranslate2 float32"),
                           (SELECTION, "ours float32"),
                           ("ours exported, int8", "ours exported, float32"),
                           (COMPILED, "ours exported, float32"),
                           (f"{COMPILED}, a process a thread", "ours exported, float32")):
        if int8 in results and baseline in results:
            results[int8]["BLEU - float32, 95%"] = bleu_difference_interval(text[baseline], text[int8], references)
            results[int8]["identical to float32"] = sum(a == b for a, b in zip(text[baseline], text[int8]))


def quality(args, data_bin):
    """``--quality``: ours float32, int8, and int8 with vocabulary selection translate the
    ``--split`` set as trained, with the same checkpoint; prints sacreBLEU of each and the 95%
    interval of each int8 setting's difference from float32."""
    task = translation_task(data_bin)
    batches, ids, _ = sentences_to_translate(task, args, data_bin, args.split)
    tasks = {"ours float32": convs2s_task(data_bin), "ours int8": convs2s_task(data_bin, quantize="int8"),
             SELECTION: convs2s_task(data_bin, vocab_selection=candidates("demo"),
                                                             quantize="int8")}
    runs = [FairseqSystem(name, fairseq_model(args.quality, mode_task), mode_task, args, batches)
            for name, mode_task in tasks.items()]
    results = measure(runs, args.repeats, None, len(ids))
    score(results, [test_text("de", args.split)[i] for i in ids])
    name = "test_2016_flickr" if args.split == "test" else "Multi30k's validation set"
    print(f"{args.quality}: {len(ids)} sentences of {name}, beam {args.beam}, batch {args.batch_size}")
    print(f"sacreBLEU float32 {results['ours float32']['BLEU']:.2f}")
    for setting in list(tasks)[1:]:
        low, high = results[setting]["BLEU - float32, 95%"]
        print(f"{setting}: sacreBLEU {results[setting]['BLEU']:.2f}; - float32, 95% interval (paired bootstrap) "
              f"{low:+.2f} to {high:+.2f}; {results[setting]['identical to float32']} translations identical; "
              f"{results[setting]['sentences/s']:.1f} sentences/s against {results['ours float32']['sentences/s']:.1f}")


# Each library's switch that holds it below the CPU's instructions (docs/performance.md: hosts
# held to AVX2). fbgemm, one of ours' int8 products, has none: it runs the CPU's own.
INSTRUCTION_SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def held_instructions(env=os.environ) -> dict:
    """The instruction switches set for this run, and ours' int8 product where pinned."""
    return {name: env[name] for name in (*INSTRUCTION_SWITCHES, PRODUCT_ENV) if env.get(name)}


def unpinned_product_warning(held: dict) -> Optional[str]:
    """Where instructions are held and ours' int8 product is not pinned, what to do: a process
    that measures fbgemm the faster (a close call held to AVX2) multiplies with the CPU's own
    instructions, and the run is not the held one."""
    if any(name in held for name in INSTRUCTION_SWITCHES) and PRODUCT_ENV not in held:
        return (f"warning: instructions held ({', '.join(f'{k}={v}' for k, v in held.items())}) with ours' int8 "
                f"product unpinned: fbgemm, which a process may measure the faster, ignores the switches; "
                f"set {PRODUCT_ENV}=int_mm")
    return None


def print_header(machine, args):
    held = machine.get("held", {})
    switches = "; " + " ".join(f"{k}={v}" for k, v in held.items()) if held else ""
    print(f"machine: {machine['cpu']}; torch.mm 2048^3 fp32 {machine['gflops']:.0f} GFLOP/s; {args.threads} threads; "
          f"load average {machine['load before']} before{switches}")
    warning = unpinned_product_warning(held)
    if warning:
        print(warning, flush=True)
    print(f"commit {machine['commit']}; beam {args.beam}, batch {args.batch_size}, {machine['sentences']} sentences "
          f"of test_2016_flickr; models trained {args.train_minutes:g} minutes each", flush=True)


def print_phase(phase, results, args):
    """One phase's table, printed as soon as it is measured (and, as trained, scored)."""
    peer = results[PEER]["sentences/s"]
    print()
    if phase == "as trained":
        print(f"| as trained | sentences/s | x {PEER} | target tokens/s | sacreBLEU | int8 - float32, 95% interval |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, r in results.items():
            low, high = r.get("BLEU - float32, 95%", (None, None))
            interval = f"{low:+.2f} to {high:+.2f} ({r['identical to float32']} identical)" if low is not None else ""
            print(f"| {name} | {r['sentences/s']:.1f} | {r['sentences/s'] / peer:.2f}x | {r['tokens/s']:.0f} | "
                  f"{r['BLEU']:.2f} | {interval} |")
    else:
        print(f"| equal work ({args.forced_length} words and </s>) | sentences/s | x {PEER} | target tokens/s "
              "| tokens a hypothesis |")
        print("|---|---:|---:|---:|---:|")
        for name, r in results.items():
            print(f"| {name} | {r['sentences/s']:.1f} | {r['sentences/s'] / peer:.2f}x | {r['tokens/s']:.0f} | "
                  f"{r['mean length']:.1f} |")
    sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    data_bin = prepare("demo")
    if args.quality:
        return quality(args, data_bin)
    systems = args.systems or SYSTEMS
    models = trained_models(args, data_bin, systems)
    _, ids, _ = sentences_to_translate(translation_task(data_bin), args, data_bin)
    references = [test_text("de")[i] for i in ids]
    sentences = len(ids)
    machine = {"cpu": cpu_description(), "gflops": matmul_gflops(), "sentences": sentences,
               "commit": source_commit(), "load before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
               "held": held_instructions()}
    log(f"translating {sentences} sentences with {len(systems)} systems, {args.repeats} passes each")
    print_header(machine, args)

    def each_phase(phase, results):
        if phase == "as trained":
            score(results, references)
        print_phase(phase, results, args)

    results = measure_each_alone(systems, models, args, data_bin, sentences, each_phase)
    as_trained, equal_work = results["as trained"], results["equal work"]
    machine["load after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average {machine['load after']} after")
    if args.json:
        strip = {"text"}
        Path(args.json).write_text(json.dumps({
            "command": " ".join(["python -m bench.serving", *(argv if argv is not None else sys.argv[1:])]),
            "args": vars(args), "machine": machine,
            "results": {phase: {name: {k: v for k, v in r.items() if k not in strip} for name, r in results.items()}
                        for phase, results in (("as trained", as_trained), ("equal work", equal_work))},
        }, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
