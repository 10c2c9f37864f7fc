"""Data preparation at WMT scale: each stage's speed and memory, ours against fairseq's pipeline.

``python -m bench.scaling --sizes 100000 500000 [--with-2m] --json scaling.json --plot scaling.png``

For each corpus size it runs every stage of ``convs2s-prepare`` and ``convs2s-align-dict``
(tokenize, clean, learn BPE, apply BPE, binarize, alignment dictionary) and the pipeline of
fairseq's ``prepare-wmt14en2fr.sh`` (Moses perl scripts where ``--moses DIR`` gives a
mosesdecoder checkout or PyPI's ``mosestokenizer`` package, else sacremoses' command line
with the same rules; subword-nmt's
``learn-bpe`` and ``apply-bpe``; ``fairseq-preprocess --workers N``; the ``fast_align``
binary where it is on PATH), each stage as a process of its own, and records its wall
time, its CPU time (with its worker processes') and the peak memory of its process tree
(proportional set size, so pages that forked workers share count once). It prints, per
stage, pairs per second, pairs per CPU-second (per core) and peak MiB, and the
extrapolation to 4.5M (WMT14 en-de) and 36M (WMT14 en-fr) pairs on 2 and 32 cores:

- CPU time grows with the corpus as fitted over the sizes measured (``cpu = a * pairs^b``,
  b between 0.5 and 2; one size: proportional);
- a stage's serial fraction s is estimated from its run on N workers
  (wall = cpu * (s + (1 - s) / N), Amdahl's law), or, when N = 1, taken from
  :data:`SERIAL` (measured on 1 and 2 workers), and its time on c cores is
  cpu * (s + (1 - s) / c): ideal scaling of the parallel part, an optimistic bound
  (``--serial`` takes our stages' s from bench.cores' runs on many cores instead, the
  alignment's parts too);
- peak memory is fitted in the same way (b between 0 and 1.5; one size: as measured): a
  rough guide only;
- our alignment dictionary apart: fast_align's model is trained on at most
  ``DEFAULT_TRAIN_SAMPLE`` pairs, so its training (its logged wall and CPU time, their
  serial fraction read as above; runs that logged no CPU time turn the wall time into CPU
  time with ``SERIAL["align dict training"]``), fitted over the pairs each run trained on
  (``train_pairs``), is extrapolated to that many pairs at most, and the rest, decoding and
  counting, in proportion to the pairs
  from the largest size measured: each pair is decoded and counted on its own with a
  table whose size stops growing with the sample (a fit over the sizes would read the
  built corpus' pairs, longer after the first pass, as growth).

Each stage's fixed costs (starting Python, importing fairseq) are measured on a corpus of
:data:`FIXED_PAIRS` pairs and taken off before the fit (and added back once).

The corpora are built from the en-de pairs of the shared data (Multi30k, WMT14 newstest,
about 37k distinct pairs), never downloaded: the first pass over them as they are, each
later pass r with every pair joined to another one drawn at random and, in a third of the
pairs, the longest word of each side given one of about sqrt(r) suffixes, so that the
sentences and the vocabulary keep growing (more slowly than the corpus, as real corpora's
do) instead of repeating 37k pairs.

``--only STAGE...`` measures only those of our stages (and the ones whose outputs they
read), not fairseq's pipeline, and takes every other figure of a size from ``--add-runs``:
after a change to one stage, its figures are renewed without running everything again.

Run it alone on the machine: the figures are meaningless beside other jobs. A smoke run:
``python -m bench.scaling --sizes 5000 --merges 500``.
"""
import argparse
import json
import math
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from convs2s_preprocess.stages.align import DEFAULT_TRAIN_SAMPLE
from convs2s_preprocess.runtime.atomic import record_path
from convs2s_preprocess.runtime.host import default_workers, descendants
from convs2s_preprocess.textio import count_lines
from convs2s_recipes.corpora import data_root

SRC, TGT = "en", "de"
# The shared data's en-de pairs: (folder, file prefix).
SOURCES = [("multi30k", "train"), ("multi30k", "val"), ("multi30k", "test_2016_flickr"),
           ("wmt14-en-de", "newstest2013"), ("wmt14-en-de", "newstest2014")]
STAGES = ["tokenize", "clean", "learn BPE", "apply BPE", "binarize", "align dict"]
PREPARATION = STAGES[:-1]  # raw text to binarized data: the stages but the alignment dictionary
# The serial fraction of each stage where a run on one worker cannot tell it.
SERIAL = {"tokenize": 0.0, "clean": 0.0, "apply BPE": 0.0, "binarize": 0.1,
          # learning 40,000 merges from the words of 2,000,000 built pairs took 154 s on 1
          # worker and 89 s on 2 (AMD EPYC, alone); counting the words is parallel too
          "learn BPE": 0.15,
          # the whole alignment dictionary: 2,000,000 built pairs took 664 s on 2 workers
          # for 1,204 s of CPU (AMD EPYC, alone)
          "align dict": 0.1, "align dict less training": 0.2,
          # fast_align's training, for runs that did not log its CPU time: 200,000 built
          # pairs took 78.7 s on 1 worker and 43.3 s on 2 (AMD EPYC, alone), so about 0.1
          "align dict training": 0.1}
# The stages whose outputs a stage reads (run first when --only asks for it).
NEEDS = {"clean": ["tokenize"], "learn BPE": ["clean"], "apply BPE": ["learn BPE"],
         "binarize": ["apply BPE"], "align dict": ["clean"]}
TARGETS = [(4_500_000, 2), (4_500_000, 32), (36_000_000, 2), (36_000_000, 32)]
SAMPLE_SECONDS = 0.2
# A corpus so small that its stages' times are their fixed costs.
FIXED_PAIRS = 200


# --- the corpora ---------------------------------------------------------------------------

def base_pairs(data: Path) -> list:
    pairs = []
    for folder, prefix in SOURCES:
        sides = [(data / folder / f"{prefix}.{lang}").read_text(encoding="utf-8").splitlines()
                 for lang in (SRC, TGT)]
        pairs += [(s, t) for s, t in zip(*sides) if s.strip() and t.strip()]
    return pairs


def _suffixed(line: str, suffix: str) -> str:
    words = line.split()
    longest = max(range(len(words)), key=lambda i: len(words[i]))
    words[longest] += suffix
    return " ".join(words)


def build_corpus(pairs: list, size: int, prefix: Path, seed: int = 1) -> None:
    """``size`` pairs in ``PREFIX.en``/``PREFIX.de``: ``pairs`` once, then varied passes."""
    rng = random.Random(seed)
    with open(f"{prefix}.{SRC}", "w", encoding="utf-8") as src_f, \
            open(f"{prefix}.{TGT}", "w", encoding="utf-8") as tgt_f:
        for index in range(size):
            repetition, (src, tgt) = divmod(index, len(pairs))[0], pairs[index % len(pairs)]
            if repetition:
                other_src, other_tgt = rng.choice(pairs)
                src, tgt = f"{src} {other_src}", f"{tgt} {other_tgt}"
                if rng.random() < 1 / 3:
                    suffix = "".join(rng.choice("aeiouy") for _ in range(2)) + \
                        str(rng.randrange(max(1, math.isqrt(repetition))))
                    src, tgt = _suffixed(src, suffix), _suffixed(tgt, suffix)
            src_f.write(src + "\n")
            tgt_f.write(tgt + "\n")


# --- measuring a process tree --------------------------------------------------------------

def _memory_kib(pid: int) -> int:
    """Proportional set size of a process (resident size where smaps_rollup is missing)."""
    for path, field in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(field):
                        return int(line.split()[1])
        except OSError:
            continue
    return 0


def tree_memory_kib(root: int) -> int:
    return sum(map(_memory_kib, [root, *descendants(root)]))


# The end of fast_align's training in an aligner's log, its duration as Progress writes it
# (str of a timedelta: "1 day, 2:03:04" past a day).
TRAINED = re.compile(r"train fast_align's model: .* in (?:(\d+) days?, )?(\d+):(\d\d):(\d\d)$",
                     re.MULTILINE)
TRAINED_CPU = re.compile(r"train fast_align's model: ([\d.]+) CPU seconds$", re.MULTILINE)


def training_seconds(log: str) -> Optional[int]:
    """The seconds that fast_align's training took according to ``log``; None if not there."""
    trained = TRAINED.search(log)
    if not trained:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in trained.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def measure(commands: list) -> dict:
    """Run shell-free commands one after another: {wall_s, cpu_s, peak_mib}, and
    ``train_s`` and ``train_cpu_s`` where a command logs the end of fast_align's training
    (its wall time and the CPU time of its processes). A command is (argv, stdin path or
    None, stdout path or None)."""
    wall = cpu = peak = 0.0
    train = train_cpu = None
    for argv, stdin, stdout in commands:
        with open(stdin or os.devnull, "rb") as inp, open(stdout or os.devnull, "wb") as out, \
                tempfile.TemporaryFile() as err:
            start = time.monotonic()
            proc = subprocess.Popen(argv, stdin=inp, stdout=out, stderr=err)
            peaks, done = [0], threading.Event()

            def sample(pid=proc.pid):  # from the start: a command may end within a period
                while True:
                    peaks[0] = max(peaks[0], tree_memory_kib(pid))
                    if done.wait(SAMPLE_SECONDS):
                        break
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            _, status, usage = os.wait4(proc.pid, 0)
            done.set()
            sampler.join()
            proc.returncode = os.waitstatus_to_exitcode(status)
            err.seek(0)
            log = err.read().decode(errors="replace")
            if proc.returncode != 0:
                raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}):\n{log[-3000:]}")
            wall += time.monotonic() - start
            cpu += usage.ru_utime + usage.ru_stime
            # not usage.ru_maxrss: Linux starts it at this process's resident size, which the
            # command's process held from fork until exec
            peak = max(peak, peaks[0] / 1024)
            trained = training_seconds(log)
            if trained is not None:
                train = (train or 0) + trained
            trained_cpu = TRAINED_CPU.search(log)
            if trained_cpu:
                train_cpu = (train_cpu or 0) + float(trained_cpu.group(1))
    return {"wall_s": wall, "cpu_s": cpu, "peak_mib": peak,
            **({"train_s": train} if train is not None else {}),
            **({"train_cpu_s": train_cpu} if train_cpu is not None else {})}


# --- the two pipelines ---------------------------------------------------------------------

def _python(code: str) -> list:
    return [sys.executable, "-c", "import logging; logging.basicConfig(level=logging.WARNING)\n" + code]


def ours(raw: Path, work: Path, workers: int, merges: int, align: bool, skip=(),
         measured=lambda stage, result: None) -> dict:
    """Each stage of convs2s-prepare (as its functions run it) and convs2s-align-dict, but
    those in ``skip`` (whose outputs an earlier run in ``work`` left); ``measured(stage,
    result)`` is called as each stage ends."""
    tok, clean, bpe, bindir = work / "tok", work / "clean", work / "bpe", work / "bin"
    sides = lambda prefix: [f"{prefix}.{lang}" for lang in (SRC, TGT)]  # noqa: E731
    stages = {
        "tokenize": _python("from convs2s_preprocess.stages.tokenize import tokenize_file\n" + "\n".join(
            f"tokenize_file({i!r}, {o!r}, {lang!r}, workers={workers})"
            for i, o, lang in zip(sides(raw), sides(tok), (SRC, TGT)))),
        "clean": _python("from convs2s_preprocess.stages.clean import clean_corpus\n"
                         f"clean_corpus(*{sides(tok)!r}, *{sides(clean)!r}, workers={workers})"),
        "learn BPE": _python("from convs2s_preprocess.stages.bpe import learn_joint_bpe\n"
                             f"learn_joint_bpe({sides(clean)!r}, {str(work / 'codes')!r}, {merges}, "
                             f"workers={workers})"),
        "apply BPE": _python("from convs2s_preprocess.stages.bpe import apply_bpe_file\n" + "\n".join(
            f"apply_bpe_file({str(work / 'codes')!r}, {i!r}, {o!r}, {workers})"
            for i, o in zip(sides(clean), sides(bpe)))),
        "binarize": _python("from convs2s_preprocess.stages.binarize import binarize\n"
                            f"binarize({str(bindir)!r}, {SRC!r}, {TGT!r}, trainpref={str(bpe)!r}, "
                            f"workers={workers})"),
    }
    if align:
        stages["align dict"] = [sys.executable, "-m", "convs2s_preprocess.stages.align", "--src", sides(clean)[0],
                                "--tgt", sides(clean)[1], "-o", str(work / "align.dict"),
                                "--workers", str(workers)]
        if "align dict" not in skip:  # else an earlier run's dictionary of the same text is kept
            for path in (work / "align.dict", Path(record_path([str(work / "align.dict")]))):
                path.unlink(missing_ok=True)
    results = {}
    for stage, argv in stages.items():
        if stage not in skip:
            results[stage] = measure([(argv, None, None)])
            if stage == "align dict":  # the pairs fast_align's model was trained on
                results[stage]["train_pairs"] = min(count_lines(sides(clean)[0]), DEFAULT_TRAIN_SAMPLE)
            measured(stage, results[stage])
    return results


def moses_scripts(folder: Path) -> tuple:
    """(normalize-punctuation, tokenizer, clean-corpus-n or None) of a mosesdecoder checkout
    or of the ``mosestokenizer`` package from PyPI (Moses' tokenizer.perl v1.1 and its
    punctuation normalizer, no cleaning script)."""
    checkout = folder / "scripts"
    if (checkout / "tokenizer" / "tokenizer.perl").is_file():
        return (checkout / "tokenizer" / "normalize-punctuation.perl",
                checkout / "tokenizer" / "tokenizer.perl",
                checkout / "training" / "clean-corpus-n.perl")
    if (folder / "tokenizer-v1.1.perl").is_file():
        return folder / "normalize-punctuation.perl", folder / "tokenizer-v1.1.perl", None
    raise SystemExit(f"--moses {folder}: neither a mosesdecoder checkout (scripts/tokenizer/"
                     "tokenizer.perl) nor the mosestokenizer package (tokenizer-v1.1.perl)")


def reference(raw: Path, work: Path, workers: int, merges: int, align: bool, moses: str) -> dict:
    """fairseq's prepare-wmt14en2fr.sh: Moses (or sacremoses' command line), subword-nmt,
    fairseq-preprocess; fast_align if installed."""
    bindir = Path(sys.executable).parent
    tok, clean, bpe = work / "tok", work / "clean", work / "bpe"
    sides = lambda prefix: [f"{prefix}.{lang}" for lang in (SRC, TGT)]  # noqa: E731
    results = {}
    if moses:
        normalize, tokenize, clean_script = moses_scripts(Path(moses))
        results["tokenize"] = measure([
            (["sh", "-c", f"perl {normalize} -l {lang} < {shlex.quote(i)} | "
                          f"perl {tokenize} -q -threads {workers} -a -no-escape -l {lang} "
                          f"> {shlex.quote(o)}"], None, None)
            for i, o, lang in zip(sides(raw), sides(tok), (SRC, TGT))])
    if moses and clean_script:
        results["clean"] = measure([(["perl", str(clean_script), "-ratio", "1.5",
                                      str(tok), SRC, TGT, str(clean), "1", "175"], None, None)])
    elif moses:
        for i, o in zip(sides(tok), sides(clean)):  # no cleaning script: the text as it is
            shutil.copyfile(i, o)
    else:
        results["tokenize"] = measure([
            ([str(bindir / "sacremoses"), "-l", lang, "-j", str(workers), "-q", "normalize", "tokenize", "-a"],
             i, o) for i, o, lang in zip(sides(raw), sides(tok), (SRC, TGT))])
        for i, o in zip(sides(tok), sides(clean)):  # no cleaning without Moses: the text as it is
            shutil.copyfile(i, o)
    joined = work / "train.joined"
    with open(joined, "wb") as out:
        for path in sides(clean):
            with open(path, "rb") as f:
                shutil.copyfileobj(f, out)
    codes = str(work / "codes")
    results["learn BPE"] = measure([([str(bindir / "subword-nmt"), "learn-bpe", "-s", str(merges),
                                      "--input", str(joined), "--output", codes], None, None)])
    results["apply BPE"] = measure([([str(bindir / "subword-nmt"), "apply-bpe", "-c", codes,
                                      "--num-workers", str(workers)], i, o)
                                    for i, o in zip(sides(clean), sides(bpe))])
    results["binarize"] = measure([([str(bindir / "fairseq-preprocess"), "--source-lang", SRC,
                                     "--target-lang", TGT, "--trainpref", str(bpe), "--destdir",
                                     str(work / "bin"), "--joined-dictionary", "--workers", str(workers)],
                                    None, None)])
    fast_align = shutil.which("fast_align")
    if align and fast_align:
        corpus = work / "corpus"
        subprocess.run(["sh", "-c", f"paste -d '\\t' {shlex.join(sides(clean))} | sed 's/\\t/ ||| /' > {corpus}"],
                       check=True)
        results["align dict"] = measure([([fast_align, "-i", str(corpus), "-d", "-o", "-v"], None,
                                          str(work / "links"))])
    return results


# --- figures -------------------------------------------------------------------------------

def _fit(sizes: list, values: list, low: float, high: float) -> tuple:
    """(a, b) of value = a * size^b, least squares in log space, b clamped to [low, high]."""
    points = [(math.log(n), math.log(max(v, 1e-9))) for n, v in zip(sizes, values)]
    if len(points) < 2:
        b = 1.0 if high > 1.5 else 0.0  # CPU time: proportional; memory: as measured
    else:
        mx = sum(x for x, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
        b = min(max(b, low), high)
    x, y = points[-1]
    return math.exp(y - b * x), b


def serial_fraction(stage: str, wall: float, cpu: float, workers: int) -> float:
    if workers <= 1 or cpu <= 0:
        return SERIAL[stage]
    return min(1.0, max(0.0, (wall / cpu - 1 / workers) / (1 - 1 / workers)))


def serial_from_walls(fewest: int, wall_fewest: float, more: int, wall_more: float) -> float:
    """Amdahl's serial fraction s from the wall times on ``fewest`` and ``more`` workers."""
    ratio = wall_fewest / wall_more
    return (1 / fewest - ratio / more) / (ratio - ratio / more - 1 + 1 / fewest)


def measured_serial(path: str) -> dict:
    """{stage: serial fraction} of our stages by bench.cores (its JSON): Amdahl's law read
    from the wall times of its fewest and most workers; the alignment dictionary's in two
    parts, its training and the rest (as :func:`extrapolate` takes them), each read from the
    wall and CPU time of its run on the most workers."""
    runs = json.loads(Path(path).read_text())["runs"]
    counts = sorted(runs, key=int)
    few, many = counts[0], counts[-1]
    serial = {stage: min(1.0, max(0.0, serial_from_walls(int(few), runs[few][stage]["wall_s"],
                                                         int(many), runs[many][stage]["wall_s"])))
              for stage in PREPARATION if stage in runs[few] and stage in runs[many]}
    align = runs[many].get("align dict", {})
    if align.get("train_cpu_s") is not None:
        serial["align dict training"] = serial_fraction(
            "align dict training", align["train_s"], align["train_cpu_s"], int(many))
        serial["align dict less training"] = serial_fraction(
            "align dict less training", align["wall_s"] - align["train_s"],
            align["cpu_s"] - align["train_cpu_s"], int(many))
    return serial


def extrapolate(runs: dict, fixed: dict, workers: int, serial: Optional[dict] = None) -> dict:
    """{pipeline: {stage: {"PAIRSxCORES": {"hours", "peak_gib"}}}} from the measured sizes,
    less the ``fixed`` costs (the stages' times on FIXED_PAIRS pairs). ``serial``: our
    stages' serial fractions as measured on many cores (:func:`measured_serial`), instead of
    those read from the runs' wall and CPU times on ``workers``.

    Our alignment dictionary trains fast_align's model on at most
    ``DEFAULT_TRAIN_SAMPLE`` pairs: its training's CPU time is extrapolated to min(pairs,
    that sample) and spread over the cores with its serial fraction, its memory likewise,
    and the rest (decoding and counting, every pair) in proportion to the pairs (see the
    module docstring).
    """
    sizes = sorted(runs, key=int)
    table = {}
    for pipeline in ("ours", "reference"):
        for stage in STAGES:
            ns = [n for n in sizes if stage in runs[n][pipeline]]
            if not ns:
                continue
            base = fixed[pipeline][stage]
            cpu = [max(runs[n][pipeline][stage]["cpu_s"] - base["cpu_s"], 1e-3) for n in ns]
            wall = [max(runs[n][pipeline][stage]["wall_s"] - base["wall_s"], 1e-3) for n in ns]
            train = [runs[n][pipeline][stage].get("train_s") for n in ns]
            capped = pipeline == "ours" and DEFAULT_TRAIN_SAMPLE and None not in train
            if capped:  # the training apart: on at most the sample
                wall = [max(w - t, 1e-3) for w, t in zip(wall, train)]
                train_cpu = [runs[n][pipeline][stage].get("train_cpu_s") for n in ns]
                if None in train_cpu:  # not logged: from its wall time and SERIAL's fraction
                    st = SERIAL["align dict training"]
                    train_cpu = [t / (st + (1 - st) / runs[n]["workers"]) for t, n in zip(train, ns)]
                else:
                    st = serial_fraction("align dict training", train[-1], train_cpu[-1], workers)
                if serial and "align dict training" in serial:
                    st = serial["align dict training"]
                train = train_cpu
                cpu = [max(c - t, 1e-3) for c, t in zip(cpu, train)]
                # the pairs each run trained on: its corpus', up to the sample size of its time
                trained_on = [runs[n][pipeline][stage].get("train_pairs", int(n)) for n in ns]
                ta, tb = _fit(trained_on, [max(t, 1e-3) for t in train], 0.5, 2.0)
            a, b = _fit([int(n) for n in ns], cpu, *((1.0, 1.0) if capped else (0.5, 2.0)))
            ma, mb = _fit(trained_on if capped else [int(n) for n in ns],
                          [runs[n][pipeline][stage]["peak_mib"] for n in ns], 0.0, 1.5)
            name = "align dict less training" if capped else stage
            s = serial_fraction(name, wall[-1], cpu[-1], workers)
            if serial and pipeline == "ours" and name in serial:
                s = serial[name]
            for pairs, cores in TARGETS:
                trained = min(pairs, DEFAULT_TRAIN_SAMPLE) if capped else pairs
                seconds = base["wall_s"] + a * pairs ** b * (s + (1 - s) / cores) \
                    + (ta * trained ** tb * (st + (1 - st) / cores) if capped else 0.0)
                cpu_seconds = base["cpu_s"] + a * pairs ** b + (ta * trained ** tb if capped else 0.0)
                table.setdefault(pipeline, {}).setdefault(stage, {})[f"{pairs}x{cores}"] = {
                    "hours": seconds / 3600, "cpu_hours": cpu_seconds / 3600,
                    "peak_gib": ma * trained ** mb / 1024}
    return table


def totals(extrapolated: dict) -> dict:
    """{name: {"PAIRSxCORES": hours}} of whole preparations from the stages' extrapolations:

    - ours with BPE: every stage but the alignment dictionary, one after the other;
    - ours at word level with the dictionary (``convs2s-prepare --no-bpe --align-dict``):
      tokenize and clean, then binarizing beside the alignment dictionary, which take the
      longer of the two, or their CPU time shared by the cores if that is longer (binarizing
      as measured on the segmented text);
    - fairseq's pipeline: its stages one after the other.
    """
    result = {}
    for name, pipeline in (("ours, BPE", "ours"), ("fairseq's pipeline", "reference")):
        cells = [extrapolated.get(pipeline, {}).get(stage) for stage in PREPARATION]
        result[name] = {key: sum(cell[key]["hours"] for cell in cells if cell)
                        for key in (f"{n}x{c}" for n, c in TARGETS)}
    ours = extrapolated.get("ours", {})
    if "align dict" in ours and "binarize" in ours:
        result["ours, word level with --align-dict"] = {}
        for pairs, cores in TARGETS:
            key = f"{pairs}x{cores}"
            before = sum(ours[stage][key]["hours"] for stage in ("tokenize", "clean") if stage in ours)
            both = [ours["binarize"][key], ours["align dict"][key]]
            beside = max(*(cell["hours"] for cell in both), sum(cell["cpu_hours"] for cell in both) / cores)
            result["ours, word level with --align-dict"][key] = before + beside
    return result


def print_tables(runs: dict, extrapolated: dict, serial: Optional[dict] = None) -> None:
    for size, result in sorted(runs.items(), key=lambda item: int(item[0])):
        print(f"\n{int(size):,} pairs, {result['workers']} workers")
        print(f"| stage | ours pairs/s | ours pairs/CPU-s | ours peak MiB | fairseq's pairs/s | "
              f"fairseq's pairs/CPU-s | fairseq's peak MiB |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for stage in STAGES:
            cells = []
            for pipeline in ("ours", "reference"):
                m = result[pipeline].get(stage)
                cells += ([f"{int(size) / m['wall_s']:,.0f}", f"{int(size) / max(m['cpu_s'], 1e-9):,.0f}",
                           f"{m['peak_mib']:,.0f}"] if m else ["n/a"] * 3)
            print(f"| {stage} | " + " | ".join(cells) + " |")
    how = ("our stages' serial fractions as measured on many cores (" +
           ", ".join(f"{stage} {fraction:.2f}" for stage, fraction in serial.items()) + ")"
           if serial else "ideal scaling of each stage's parallel part")
    print(f"\nExtrapolated hours (peak GiB), {how}:")
    header = [f"{pairs / 1e6:g}M pairs, {cores} cores" for pairs, cores in TARGETS]
    print("| pipeline | stage | " + " | ".join(header) + " |")
    print("|---|---|" + "---:|" * len(TARGETS))
    for pipeline, stages in extrapolated.items():
        for stage, cells in stages.items():
            values = [cells[f"{pairs}x{cores}"] for pairs, cores in TARGETS]
            print(f"| {pipeline} | {stage} | " + " | ".join(
                f"{v['hours']:.2f} ({v['peak_gib']:.1f})" for v in values) + " |")
    for name, hours in totals(extrapolated).items():
        print(f"| {name} | total | " + " | ".join(
            f"{hours[f'{pairs}x{cores}']:.2f}" for pairs, cores in TARGETS) + " |")


def plot(runs: dict, extrapolated: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # per core at the largest size both pipelines ran, so that each legend entry has its bars
    largest = max([size for size in runs if runs[size].get("reference")] or runs, key=int)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.38
    for offset, pipeline, label in ((-width / 2, "ours", "convs2s-prepare"),
                                    (width / 2, "reference", "fairseq's pipeline")):
        if not runs[largest].get(pipeline):
            continue
        rates = [int(largest) / runs[largest][pipeline][s]["cpu_s"] if s in runs[largest][pipeline]
                 else 0 for s in STAGES]
        left.bar([i + offset for i in range(len(STAGES))], rates, width, label=label)
    left.set_xticks(range(len(STAGES)), STAGES, rotation=20)
    left.set_yscale("log")
    left.set_ylabel("pairs per CPU-second")
    left.set_title(f"per core, {int(largest):,} pairs")
    left.legend()
    groups = [(pipeline, pairs, cores) for pairs, cores in TARGETS if pairs == 36_000_000
              for pipeline in ("ours", "reference") if pipeline in extrapolated]
    bottoms = [0.0] * len(groups)
    for stage in PREPARATION:
        heights = [extrapolated[p].get(stage, {}).get(f"{n}x{c}", {"hours": 0})["hours"] for p, n, c in groups]
        right.bar(range(len(groups)), heights, bottom=bottoms, label=stage)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    right.set_xticks(range(len(groups)), [f"{'ours' if p == 'ours' else 'fairseq'}\n{c} cores"
                                          for p, _, c in groups])
    right.set_ylim(0, 1.08 * max(bottoms))
    right.set_ylabel("hours (extrapolated)")
    right.set_title("36M pairs (WMT14 en-fr), without the alignment dictionary")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _with_earlier(new: Optional[dict], earlier: dict) -> dict:
    """A size's figures: ``new``'s, and ``earlier``'s for the stages ``new`` lacks."""
    if new is None:
        return earlier
    return {**earlier, **new, **{pipeline: {**earlier[pipeline], **new[pipeline]}
                                 for pipeline in ("ours", "reference")}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 500_000],
                        help="corpus sizes in pairs (default 100000 500000); none: only "
                             "extrapolate the runs of --add-runs")
    parser.add_argument("--with-2m", action="store_true", help="also 2,000,000 pairs")
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="processes per stage, both pipelines (default: the cores available)")
    parser.add_argument("--merges", type=int, default=40000, help="BPE merges (default 40000)")
    parser.add_argument("--no-align", action="store_true", help="leave the alignment dictionary out")
    parser.add_argument("--moses", metavar="DIR",
                        help="Moses' perl scripts tokenize (and clean) the reference: a mosesdecoder "
                             "checkout, or the folder of PyPI's mosestokenizer package (`pip "
                             "download --no-deps mosestokenizer==1.2.1`, unpacked: "
                             "src/mosestokenizer)")
    parser.add_argument("--workdir", help="where the corpora and outputs go (default: a temporary "
                                          "folder, removed at the end)")
    parser.add_argument("--add-runs", metavar="JSON", nargs="+", default=[],
                        help="also fit the sizes measured by earlier runs (their --json files; the "
                             "same machine and code) that this run does not measure")
    parser.add_argument("--serial", metavar="CORES_JSON",
                        help="our stages' serial fractions from bench.cores' --json on a machine "
                             "with many cores, instead of those read from this run's workers")
    parser.add_argument("--only", nargs="+", choices=STAGES, metavar="STAGE",
                        help="measure only these of our stages (and those whose outputs they "
                             "read), not fairseq's pipeline; the other figures come from --add-runs")
    parser.add_argument("--json", metavar="FILE", help="write the measurements and extrapolation")
    parser.add_argument("--plot", metavar="PNG", help="draw per-core speed and the 36M extrapolation")
    args = parser.parse_args(argv)
    sizes = sorted(set(args.sizes + ([2_000_000] if args.with_2m else [])))
    if not sizes and not args.add_runs:
        parser.error("give --sizes to measure, or --add-runs to extrapolate")
    if args.only and not args.add_runs:
        parser.error("--only takes the other stages' figures from --add-runs: give them")
    running, wanted = set(), list(args.only or STAGES)
    while wanted:
        stage = wanted.pop()
        running.add(stage)
        wanted += NEEDS.get(stage, [])
    pairs = base_pairs(Path(data_root()))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="convs2s-scaling-"))
    runs = {}
    try:
        for size in [FIXED_PAIRS] * bool(sizes) + sizes:
            folder = workdir / str(size)
            for name in ("ours", "reference"):
                (folder / name).mkdir(parents=True, exist_ok=True)
            build_corpus(pairs, size, folder / "raw")
            print(f"{size:,} pairs: convs2s-prepare's stages", file=sys.stderr, flush=True)
            result = {"workers": args.workers,
                      "ours": ours(folder / "raw", folder / "ours", args.workers, args.merges,
                                   not args.no_align, skip=set(STAGES) - running), "reference": {}}
            if not args.only:
                print(f"{size:,} pairs: fairseq's pipeline", file=sys.stderr, flush=True)
                result["reference"] = reference(folder / "raw", folder / "reference", args.workers,
                                                args.merges, not args.no_align, args.moses)
            runs[str(size)] = result
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    fixed = runs.pop(str(FIXED_PAIRS), None)
    for path in args.add_runs:
        earlier = json.loads(Path(path).read_text())
        fixed = _with_earlier(fixed, earlier["fixed"])
        for size, result in earlier["runs"].items():
            runs[size] = _with_earlier(runs.get(size), result)
    serial = measured_serial(args.serial) if args.serial else None
    extrapolated = extrapolate(runs, fixed, args.workers, serial)
    print_tables(runs, extrapolated, serial)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "base_pairs": len(pairs),
                                               "fixed": fixed, "runs": runs,
                                               "extrapolated": extrapolated,
                                               "totals": totals(extrapolated)}, indent=2))
    if args.plot:
        plot(runs, extrapolated, args.plot)


if __name__ == "__main__":
    main()
