"""Data-parallel training through fairseq's own distributed path: 2 CPU processes over gloo.

Each process runs fairseq-train's real entry point (tests/distributed_worker.py) with an
explicit rank, ``--distributed-no-spawn`` and ``--ddp-backend legacy_ddp`` (fairseq's
``pytorch_ddp`` wrapper refuses CPU modules). fairseq saves checkpoints on rank 0 only, so
the worker saves its own rank's parameters after training; the test compares them.
"""
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

from cli_helpers import PAPER_OPTIONS, run, write_lines
from conftest import ROOT

TRAIN_LINES = 400
MAX_UPDATE = 10
WORLD_SIZE = 2
TIMEOUT_S = 180  # a hung rendezvous or collective fails the test instead of hanging it
WORKER = ROOT / "tests" / "distributed_worker.py"


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory, data_dir):
    """A few hundred Multi30k en-de lines, binarized by fairseq-preprocess with a joint dictionary."""
    work = tmp_path_factory.mktemp("multi30k_ddp")
    for lang in ("en", "de"):
        lines = (data_dir / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        write_lines(work / f"train.{lang}", lines[:TRAIN_LINES])
    run("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", work / "train",
        "--destdir", work / "bin", "--joined-dictionary", "--workers", "1")
    return work / "bin"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_args(data_bin, save_dir, seed=1):
    return [
        str(data_bin), "--user-dir", "fairseq_convs2s_ext", "--task", "translation", "--arch", "convs2s_tiny",
        "--criterion", "convs2s_cross_entropy", *PAPER_OPTIONS,
        "--max-tokens", "300", "--max-update", str(MAX_UPDATE), "--disable-validation",
        "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--no-progress-bar", "--log-interval", "1",
        "--seed", str(seed), "--num-workers", "0", "--cpu",
    ]


def distributed_args(port, rank, world_size=WORLD_SIZE):
    return [
        "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-rank", str(rank),
        "--distributed-world-size", str(world_size), "--distributed-no-spawn",
        "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
    ]


def run_workers(tmp_path, per_worker_args):
    """Start one worker per argument list at once; wait for all, failing on an error or TIMEOUT_S.

    Returns ([saved state of each worker], [log of each worker]).
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    outs = [tmp_path / f"worker{i}.pt" for i in range(len(per_worker_args))]
    logs = [tmp_path / f"worker{i}.log" for i in range(len(per_worker_args))]
    procs = []
    try:
        for out, log, args in zip(outs, logs, per_worker_args):
            with open(log, "w") as f:
                procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out), *args],
                                              cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + TIMEOUT_S
        while None in [p.poll() for p in procs]:  # poll every worker (a list, not a short-circuiting any())
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                texts = "\n".join(f"--- worker {i} ---\n{log.read_text()[-4000:]}" for i, log in enumerate(logs))
                why = f"worker {failed[0]} failed" if failed else f"workers still running after {TIMEOUT_S} s"
                pytest.fail(f"{why}:\n{texts}")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = [log.read_text() for log in logs]
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"worker {i} exited {p.returncode}:\n{texts[i][-4000:]}"
    return [torch.load(out, weights_only=True) for out in outs], texts


def max_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def two_workers(data_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    port = free_port()
    states, logs = run_workers(tmp, [train_args(data_bin, tmp / "checkpoints") + distributed_args(port, rank)
                                     for rank in range(WORLD_SIZE)])
    return states, logs, tmp / "checkpoints"


def test_both_ranks_joined_one_gloo_group(two_workers):
    states, logs, _ = two_workers
    assert [(s["rank"], s["world_size"]) for s in states] == [(0, 2), (1, 2)]
    for rank, log in enumerate(logs):
        assert re.search(rf"initialized host \S+ as rank {rank}\b", log), log[-3000:]
    assert "training on 2 devices" in logs[0], logs[0][-3000:]
    assert re.search(rf"\| num_updates {MAX_UPDATE} \|", logs[0]), logs[0][-3000:]


def test_the_ranks_trained_on_different_batches(two_workers):
    states, _, _ = two_workers
    batches = [[digest for _, digest in s["batches"]] for s in states]
    assert [len(b) for b in batches] == [MAX_UPDATE] * WORLD_SIZE  # one batch per rank per update
    assert not set(batches[0]) & set(batches[1]), "both ranks ran forward on the same batch"


def test_each_update_combined_both_ranks_batches(two_workers):
    """fairseq's per-update statistics (rank 0's log) sum the sentences of both ranks' batches."""
    states, logs, _ = two_workers
    logged = {int(n): int(bsz) for bsz, n in re.findall(r"train_inner\b.* bsz=(\d+), num_updates=(\d+)", logs[0])}
    sizes = [[sentences for sentences, _ in s["batches"]] for s in states]
    assert logged == {i + 1: a + b for i, (a, b) in enumerate(zip(*sizes))}


def test_both_ranks_end_with_identical_parameters_that_training_changed(two_workers):
    states, _, _ = two_workers
    rank0, rank1 = states
    assert max_difference(rank0["initial"], rank1["initial"]) == 0  # same seed, same initialization
    assert max_difference(rank0["final"], rank0["initial"]) > 1e-3
    assert max_difference(rank0["final"], rank1["final"]) == 0


def test_the_kept_model_is_the_one_fairseq_saved(two_workers):
    """The worker's reference is fairseq's model: rank 0's checkpoint holds the same parameters."""
    states, _, save_dir = two_workers
    assert sorted(p.name for p in save_dir.glob("*.pt")) == ["checkpoint_last.pt"]  # rank 0 only, no validation
    saved = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert saved["optimizer_history"][-1]["num_updates"] == MAX_UPDATE
    assert max_difference(saved["model"], states[0]["final"]) == 0
