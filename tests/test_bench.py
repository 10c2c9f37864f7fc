"""bench/benchmark.py --quick end to end (slow: it prepares Multi30k with BPE on first use),
and the reference model's training.

A smoke test of the benchmark's code paths, not a measurement: no figure is asserted on
speed. It does check what the benchmark claims besides speed: ours, imported from fconv,
translates every sentence exactly as fconv does in fp32."""
import json
import os
import subprocess
import sys

import math

import pytest
import sacrebleu
import torch
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from bench.benchmark import bleu_difference_interval
from bench.generation import model_scores
from bench.machine import source_commit
from bench.reference import reference_checkpoint
from conftest import DATA, ROOT
from model_helpers import build, random_tokens, with_random_biases


@pytest.mark.slow
def test_quick_benchmark_prints_the_table_and_identical_hypotheses(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, CONVS2S_DATA=str(DATA), XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(tmp_path)))
    # With fconv's encoder gradient scale both models compute the same updates.
    proc = subprocess.run([sys.executable, "-m", "bench.benchmark", "--quick", "--fconv-gradient-scale",
                           "--vocab-selection", "--train-bleu", "--json", str(out)],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "ours / fconv" in proc.stdout and "torch.mm" in proc.stdout
    results = json.loads(out.read_text())["results"]
    sentences = results["sentences"]
    for beam in (5, 1):
        assert results["ours"][f"beam {beam} identical"] == sentences == results["fconv"][f"beam {beam} identical"]
    names = ["fconv", "ours", "ours, vocabulary selection"] + [n for n in results if n.startswith("ours b")]
    for name in names:
        assert results[name]["train tokens/s"] > 0 and results[name]["generate peak MiB"] > 0
        assert results[name]["BLEU after training"] >= 0
    assert abs(results["ours"]["valid loss"] / results["fconv"]["valid loss"] - 1) < 0.002
    selection = results["ours, vocabulary selection"]
    vocabulary = int(results["dictionaries"].split(" / ")[1])
    assert 0 < selection["candidates per sentence"] < selection["train candidates per batch"] <= vocabulary
    assert selection["arithmetic ratio"] > 1  # fewer words scored than the vocabulary's
    for run in (selection, results["ours, selection, lua softmax"]):
        if run["beam 5 identical"] < sentences:  # its BLEU against the test set's sampling
            assert run["beam 5 BLEU - fconv's, 95% from"] <= run["beam 5 BLEU - fconv's, 95% to"]
            assert math.isfinite(run["beam 5 score deficit"])


def test_model_scores_are_the_beam_search_s_own_scores():
    """The score deficit's scores, by forced decoding, are those fairseq's beam search gives
    its hypotheses (lenpen 1: the mean log-probability of their words and end of sentence)."""
    torch.manual_seed(0)
    model, d = build(vocab=60)
    with_random_biases(model)
    model.eval()
    task = TranslationTask(TranslationConfig(), d, d)
    src = random_tokens(d, 5, 7)
    sample = {"id": torch.arange(5), "net_input": {"src_tokens": src, "src_lengths": torch.full((5,), 7)}}
    hypos = SequenceGenerator([model], d, beam_size=3, max_len_b=10).generate([model], sample)
    scores = model_scores(model, task, [sample], {i: nbest[0]["tokens"] for i, nbest in enumerate(hypos)})
    for i, nbest in enumerate(hypos):
        assert scores[i] == pytest.approx(nbest[0]["score"].item(), abs=1e-5)


def test_bleu_difference_interval_tells_a_real_difference_from_none():
    """Paired bootstrap on test_2016_flickr's German references: a system that drops the last
    words of every other sentence is surely worse than the baseline; one that differs from it
    in one sentence cannot be told apart from it; the baseline against itself differs by 0.
    The interval holds the corpus's own difference (sacreBLEU's corpus scores)."""
    references = (DATA / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    baseline = [" ".join(line.split()[:8]) for line in references]
    shorter = [" ".join(line.split()[:4]) if i % 2 else line for i, line in enumerate(baseline)]
    one_word = [" ".join(baseline[0].split()[:-1])] + baseline[1:]
    corpus = sacrebleu.BLEU().corpus_score
    difference = corpus(shorter, [references]).score - corpus(baseline, [references]).score
    low, high = bleu_difference_interval(baseline, shorter, references)
    assert low < difference < high < 0.25 * difference < 0
    low, high = bleu_difference_interval(baseline, one_word, references)
    assert low <= 0 <= high and high - low < 0.1
    assert bleu_difference_interval(baseline, baseline, references) == (0, 0)


@pytest.mark.slow  # two fairseq-train runs of the benchmark's reference, 16 s
def test_a_reference_cut_off_is_resumed_from_its_last_checkpoint(small_bin, tmp_path, monkeypatch):
    """A reference whose training was cut off (its checkpoint_last.pt, no ``done``) is resumed
    by fairseq-train, which reads the checkpoint back under torch's weights_only loading."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    checkpoint = reference_checkpoint(small_bin, epochs=1)
    (checkpoint.parent / "done").unlink()  # as if killed after its last checkpoint
    assert reference_checkpoint(small_bin, epochs=1) == checkpoint  # resumed: nothing left to train
    assert (checkpoint.parent / "done").exists()


def test_gpu_table_keeps_and_prints_what_a_time_limit_cut_short(tmp_path, capsys):
    """bench.gpu rewrites its JSON after each measurement; a row cut short prints as far as it got."""
    from bench import gpu

    args = gpu.parse_args(["--cpu", "--compile", "--json", str(tmp_path / "gpu.json")])
    results = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "train": {
        "wmt_en_ro, 4000 tokens, fp32": {"fconv": (38610.0, 9.27), "ours": (38368.0, 9.27)},
        "wmt_en_ro, 4000 tokens, fp16": {"fconv": (45097.0, 9.77)},  # ours was running
    }}
    gpu.save(args, results)
    gpu.print_table(args, results)
    table = capsys.readouterr().out
    assert json.loads((tmp_path / "gpu.json").read_text())["results"] == json.loads(json.dumps(results))
    rows = {line[:34].strip(): line[34:].split() for line in table.splitlines() if line.startswith("wmt_en_ro")}
    assert rows == {"wmt_en_ro, 4000 tokens, fp32": ["38,610", "(9.27)", "38,368", "(9.27)", "0.99x"],
                    "wmt_en_ro, 4000 tokens, fp16": ["45,097", "(9.77)", "-", "-"]}
    assert "NVIDIA H200" in table and "ours fp16 / ours fp32" not in table


def test_gpu_bench_keeps_each_fairseq_run_output_in_its_log(tmp_path):
    """A fairseq run's whole output is in its log file (a run stopped by a time limit keeps
    what it printed); a failure names the file."""
    from bench import gpu

    log = tmp_path / "generate-fconv-fp32.log"
    with pytest.raises(SystemExit, match=f"its whole output: {log}"):
        gpu.fairseq("generate", tmp_path / "no-such-data", "--path", tmp_path / "no.pt", "--cpu", log=log)
    assert "no.pt" in log.read_text() and "Traceback" in log.read_text()


def test_source_commit_names_the_checkout_and_says_when_its_files_changed(tmp_path):
    """What a benchmark's JSON and table give as the commit its figures are from."""
    assert source_commit(tmp_path) is None  # not a git checkout

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "model.py").write_text("a = 1\n")
    git("add", "model.py")
    git("commit", "-q", "-m", "first")
    head = git("rev-parse", "--short", "HEAD")
    assert source_commit(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked\n")  # not part of the code measured
    assert source_commit(tmp_path) == head
    (tmp_path / "model.py").write_text("a = 2\n")
    assert source_commit(tmp_path) == head + "+changes"
