"""bench.scaling: the corpora it builds from the shared data, its extrapolation, and a smoke run."""
import copy
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.scaling import (FIXED_PAIRS, SERIAL, STAGES, TARGETS, base_pairs, build_corpus, extrapolate, measured_serial,
                           measure, ours, serial_from_walls, totals, training_seconds, _with_earlier)
from conftest import DATA, ROOT
from convs2s_preprocess.stages.align import DEFAULT_TRAIN_SAMPLE
from convs2s_preprocess.runtime.progress import Progress

needs_data = pytest.mark.skipif(not (DATA / "multi30k").is_dir() or not (DATA / "wmt14-en-de").is_dir(),
                                reason=f"Multi30k or WMT14 en-de not found under {DATA}")


@needs_data
def test_corpus_repeats_the_shared_pairs_with_variation(tmp_path):
    pairs = base_pairs(DATA)
    assert len(pairs) > 35_000
    size = 2 * len(pairs) + 10
    build_corpus(pairs, size, tmp_path / "raw")
    src, tgt = ((tmp_path / f"raw.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
    assert len(src) == len(tgt) == size
    assert list(zip(src, tgt))[:len(pairs)] == pairs  # the first pass as it is
    later = set(zip(src[len(pairs):], tgt[len(pairs):]))
    assert len(later) > 0.99 * (size - len(pairs)) and not later & set(pairs)  # new sentences
    words = {w for line in src[:len(pairs)] for w in line.split()}
    assert len({w for line in src for w in line.split()}) > 1.2 * len(words)  # and new words


@needs_data
def test_each_run_trains_the_aligner_again(tmp_path):
    """A second run in the same folder (--only "align dict" after a full run) measures the
    aligner, not convs2s-align-dict finding its earlier dictionary of the same text up to date
    (which took 0.2 s and was recorded as the stage's figures)."""
    build_corpus(base_pairs(DATA)[:300], 300, tmp_path / "raw")
    (tmp_path / "work").mkdir()
    runs = [ours(tmp_path / "raw", tmp_path / "work", 1, 50, align=True, skip=set(STAGES) - keep)
            for keep in ({"tokenize", "clean", "align dict"}, {"align dict"})]
    assert [run["align dict"]["train_s"] is not None for run in runs] == [True, True]
    # the training's CPU time, from its log: part of the stage's
    assert all(0 < run["align dict"]["train_cpu_s"] < run["align dict"]["cpu_s"] for run in runs)


@pytest.mark.parametrize("seconds", [42, 7_384, 93_784, 2 * 86_400 + 5])
def test_the_training_time_is_read_from_the_aligners_log_past_a_day(caplog, seconds):
    """The aligner's last progress line, as Progress writes it ("in 1 day, 2:03:04" past a day:
    the benchmark did not find it before)."""
    caplog.set_level(logging.INFO)
    progress = Progress("train fast_align's model", 12, unit="pair passes")
    progress.update(12)
    progress.start -= seconds
    progress.finish()
    log = "\n".join(f"2026-11-25 23:48:25,659 | {r.getMessage()}" for r in caplog.records)
    assert training_seconds(log) == seconds
    assert training_seconds("2026-11-25 23:48:25,659 | decode: 12/12 pairs in 0:00:01") is None


def _stage(wall, cpu, peak=100.0):
    return {"wall_s": wall, "cpu_s": cpu, "peak_mib": peak}


def test_extrapolation_follows_the_fit_and_amdahl():
    """CPU time proportional to the corpus; a stage that kept 2 workers busy (wall = cpu / 2)
    is 16 times faster on 32 cores, one that ran on one (wall = cpu) is not; the fixed cost
    is added once."""
    fixed = {p: {s: _stage(1.0, 1.0) for s in STAGES} for p in ("ours", "reference")}
    runs = {str(n): {p: {"tokenize": _stage(1 + n / 2000, 1 + n / 1000, 50 + n / 1000),
                         "learn BPE": _stage(1 + n / 1000, 1 + n / 1000)}
                     for p in ("ours", "reference")} for n in (100_000, 200_000)}
    table = extrapolate(runs, fixed, workers=2)["ours"]
    tokenize, bpe = table["tokenize"], table["learn BPE"]
    assert tokenize["36000000x2"]["hours"] == pytest.approx((1 + 36_000 / 2) / 3600, rel=1e-6)
    assert tokenize["36000000x32"]["hours"] == pytest.approx((1 + 36_000 / 32) / 3600, rel=1e-6)
    assert bpe["36000000x32"]["hours"] == pytest.approx((1 + 36_000) / 3600, rel=1e-6)
    assert tokenize["4500000x2"]["peak_gib"] > 4 * 50 / 1024  # memory that grew with the corpus

    # a serial fraction measured on many cores (bench.cores) replaces the one read from 2
    measured = extrapolate(runs, fixed, workers=2, serial={"tokenize": 0.25})
    assert measured["ours"]["tokenize"]["36000000x32"]["hours"] == \
        pytest.approx((1 + 36_000 * (0.25 + 0.75 / 32)) / 3600, rel=1e-6)
    assert measured["reference"] == extrapolate(runs, fixed, workers=2)["reference"]  # ours only


def test_alignment_extrapolates_its_training_capped_and_the_rest_in_proportion():
    """Our alignment dictionary: fast_align's training (logged, on the workers) stops
    growing at the default sample and spreads over the cores with its serial fraction;
    decoding and counting grow with the pairs from the largest size measured, even where the
    sizes measured grew faster (the built corpus' longer pairs)."""
    cap, st = DEFAULT_TRAIN_SAMPLE, SERIAL["align dict training"]
    on_2 = st + (1 - st) / 2  # the share of its CPU time that the training's wall is on 2 workers

    def stage(train: float, rest: float, trained: int) -> dict:  # rest: CPU s, spread ideally
        return {**_stage(1 + train + rest / 2, 1 + train / on_2 + rest), "train_s": train,
                "train_pairs": trained}

    fixed = {"ours": {"align dict": {**_stage(1.0, 1.0), "train_s": 0}}, "reference": {}}
    runs = {str(n): {"workers": 2, "ours": {"align dict": stage(train, rest, min(n, cap))},
                     "reference": {}}
            for n, train, rest in ((cap // 5, 100, 30), (cap, 1000, 300))}
    cells = extrapolate(runs, fixed, workers=2)["ours"]["align dict"]
    # the training at 36M is the one measured at the cap; the rest grows with the pairs
    assert cells["36000000x2"]["hours"] == pytest.approx((1 + 1000 + 300 * (36_000_000 / cap) / 2) / 3600,
                                                         rel=1e-6)
    assert cells["36000000x32"]["hours"] == pytest.approx(
        (1 + 1000 / on_2 * (st + (1 - st) / 32) + 300 * (36_000_000 / cap) / 32) / 3600, rel=1e-6)

    # the training's CPU time logged: its serial fraction read from it (0.3 on 2 workers)
    logged = copy.deepcopy(runs)
    for run in logged.values():
        cell = run["ours"]["align dict"]
        cell["train_cpu_s"] = cell["train_s"] / 0.65
        cell["cpu_s"] += cell["train_cpu_s"] - cell["train_s"] / on_2
    cells = extrapolate(logged, fixed, workers=2)["ours"]["align dict"]
    assert cells["36000000x2"]["hours"] == pytest.approx((1 + 1000 + 300 * (36_000_000 / cap) / 2) / 3600,
                                                         rel=1e-6)
    assert cells["36000000x32"]["hours"] == pytest.approx(
        (1 + 1000 / 0.65 * (0.3 + 0.7 / 32) + 300 * (36_000_000 / cap) / 32) / 3600, rel=1e-6)

    # both parts' serial fractions measured on many cores (bench.cores) replace those read on 2
    serial = {"align dict training": 0.05, "align dict less training": 0.1}
    cells = extrapolate(logged, fixed, workers=2, serial=serial)["ours"]["align dict"]
    assert cells["36000000x32"]["hours"] == pytest.approx(
        (1 + 1000 / 0.65 * (0.05 + 0.95 / 32) + 300 * (36_000_000 / cap) * (0.1 + 0.9 / 32)) / 3600,
        rel=1e-6)

    # a larger run that trained on a smaller sample (an earlier cap), at the same power of its
    # pairs: fitted by the pairs it trained on, the prediction stays (not by its corpus' pairs)
    train = 1000 * 0.5 ** (math.log(10) / math.log(5))
    runs[str(4 * cap)] = {"workers": 2, "ours": {"align dict": stage(train, 1200, cap // 2)},
                          "reference": {}}
    hours = extrapolate(runs, fixed, workers=2)["ours"]["align dict"]["36000000x2"]["hours"]
    assert hours == pytest.approx((1 + 1000 + 300 * (36_000_000 / cap) / 2) / 3600, rel=1e-6)


def test_word_level_total_runs_binarizing_beside_the_alignment():
    """--no-bpe --align-dict: tokenize and clean, then the longer of binarizing and the
    alignment dictionary, or their CPU time over the cores where the cores are too few for
    both; with BPE, the stages but the alignment one after the other."""
    def cell(hours, cpu_hours):
        return {f"{n}x{c}": {"hours": hours, "cpu_hours": cpu_hours, "peak_gib": 1.0} for n, c in TARGETS}
    ours = {"tokenize": cell(0.1, 1.0), "clean": cell(0.05, 0.1), "learn BPE": cell(0.5, 0.5),
            "apply BPE": cell(0.2, 2.0), "binarize": cell(0.3, 4.0), "align dict": cell(0.8, 9.0)}
    result = totals({"ours": ours, "reference": {"tokenize": cell(2.0, 2.0)}})
    assert result["ours, BPE"]["36000000x32"] == pytest.approx(0.1 + 0.05 + 0.5 + 0.2 + 0.3)
    assert result["ours, word level with --align-dict"]["36000000x32"] == pytest.approx(0.15 + 0.8)
    assert result["ours, word level with --align-dict"]["36000000x2"] == pytest.approx(0.15 + 13.0 / 2)
    assert result["fairseq's pipeline"]["4500000x2"] == pytest.approx(2.0)


@pytest.mark.slow
@needs_data
def test_smoke_run_writes_table_json_and_plot(tmp_path):
    """The whole benchmark on 1000 pairs (about a minute and a half on 2 cores)."""
    out = tmp_path / "scaling.json"
    proc = subprocess.run([sys.executable, "-m", "bench.scaling", "--sizes", "1000", "--merges", "200",
                           "--json", str(out), "--plot", str(tmp_path / "scaling.png")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "| tokenize |" in proc.stdout and "36M pairs, 32 cores" in proc.stdout
    record = json.loads(out.read_text())
    assert set(record["runs"]["1000"]["ours"]) == set(STAGES) and str(FIXED_PAIRS) not in record["runs"]
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_peak_memory_is_the_commands_not_the_measuring_process():
    """A command measured from a process that holds 400 MiB: its peak is its own (Linux
    starts a child's ru_maxrss at its parent's resident size, kept from fork to exec),
    and a command that takes 200 MiB is seen taking them."""
    held = bytearray(400 * 2**20)  # touched: resident
    small = measure([([sys.executable, "-c", "import time; time.sleep(1)"], None, None)])
    large = measure([([sys.executable, "-c", "import time; b = bytearray(200 * 2**20); time.sleep(1)"],
                      None, None)])
    assert small["peak_mib"] < 100 and 200 < large["peak_mib"] < 300
    del held


def test_serial_fraction_reads_amdahls_law_back():
    """bench.cores: the serial fraction that two wall times give is the one that made them."""
    for s in (0.0, 0.06, 0.5, 1.0):
        wall = lambda n: 100 * (s + (1 - s) / n)  # noqa: E731
        assert serial_from_walls(2, wall(2), 16, wall(16)) == pytest.approx(s)


def test_serial_fractions_from_many_cores_the_alignments_from_its_own_times(tmp_path):
    """bench.scaling --serial: a stage's serial fraction from bench.cores' fewest and most
    workers; the alignment dictionary's, measured on the most only, from that run's wall
    and CPU time, its training's and the rest's apart."""
    align = {**_stage(100.0, 1000.0), "train_s": 60.0, "train_cpu_s": 780.0}
    path = tmp_path / "cores.json"
    path.write_text(json.dumps({"runs": {"2": {"tokenize": _stage(20.0, 40.0)},
                                         "16": {"tokenize": _stage(5.0, 60.0), "align dict": align}}}))
    serial = measured_serial(str(path))
    assert serial["tokenize"] == pytest.approx(serial_from_walls(2, 20.0, 16, 5.0))
    assert serial["align dict training"] == pytest.approx((60 / 780 - 1 / 16) / (1 - 1 / 16))
    assert serial["align dict less training"] == pytest.approx((40 / 220 - 1 / 16) / (1 - 1 / 16))


@pytest.mark.slow  # bench.cores end to end, 15 s: the default run keeps its early-stop test
@needs_data
def test_cores_smoke_run_times_every_stage_per_count(tmp_path):
    """bench.cores on 2,000 pairs with 1 and 2 workers, the alignment dictionary too (about
    half a minute on 2 cores): every stage's times and peak memory per count; the serial
    fractions it gives bench.scaling, the alignment's in its two parts."""
    out = tmp_path / "cores.json"
    proc = subprocess.run([sys.executable, "-m", "bench.cores", "--size", "2000", "--workers", "1", "2",
                           "--merges", "100", "--align", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "speed-up over 1 workers" in proc.stdout and " binarize " in proc.stdout
    assert "\nalign dict " in proc.stdout and "peak MiB" in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    assert set(runs["1"]) == set(runs["2"]) == {"tokenize", "clean", "learn BPE", "apply BPE", "binarize",
                                                "align dict"}
    assert all(run["peak_mib"] > 0 for run in runs["2"].values())
    assert set(measured_serial(str(out))) == {"tokenize", "clean", "learn BPE", "apply BPE", "binarize",
                                              "align dict training", "align dict less training"}


@needs_data
def test_cores_run_stopped_early_keeps_the_stages_it_measured(tmp_path):
    """bench.cores writes its JSON as each stage ends, the most workers first: killed after
    its first stage, the figures of that stage are there (a lent machine's lease can end
    before the fewest workers' run does)."""
    out = tmp_path / "cores.json"
    proc = subprocess.Popen([sys.executable, "-m", "bench.cores", "--size", "2000", "--workers", "1", "2",
                             "--merges", "100", "--json", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        while not out.exists() and proc.poll() is None:
            time.sleep(0.02)
        runs = json.loads(out.read_text())["runs"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "tokenize" in runs["2"] and runs["1"] == {}
    assert runs["2"]["tokenize"]["wall_s"] > 0


def test_only_some_stages_measured_take_the_others_from_the_earlier_run():
    """--only renews some of our stages' figures; the others, and fairseq's, stay those of
    --add-runs."""
    earlier = {"workers": 2, "ours": {"tokenize": _stage(1, 2), "align dict": _stage(9, 9)},
               "reference": {"tokenize": _stage(5, 5)}}
    new = {"workers": 2, "ours": {"tokenize": _stage(3, 4)}, "reference": {}}
    assert _with_earlier(new, earlier) == {
        "workers": 2, "ours": {"tokenize": _stage(3, 4), "align dict": _stage(9, 9)},
        "reference": {"tokenize": _stage(5, 5)}}
    assert _with_earlier(None, earlier) == earlier
