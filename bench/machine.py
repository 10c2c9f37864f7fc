"""The machine's measured matrix-multiply throughput, to read results as a fraction of peak,
and the commit a benchmark ran at."""
import os
import subprocess
import time
from pathlib import Path
from typing import Optional

import torch

from fairseq_convs2s_ext.hardware import cpu_has_native_bf16, cpu_model


def native_bf16(device="cpu"):
    """Whether bf16 matrix multiplies run natively: on a GPU, or a CPU with AVX512-BF16 or AMX
    (native is not faster: ``--autocast-bf16`` decides from a timed probe, see hardware.py)."""
    return device == "cuda" or cpu_has_native_bf16()


def cpu_description():
    """The CPU's model name, core count and torch's CPU capability (AVX2, AVX512, ...)."""
    model = cpu_model() or "unknown CPU"
    bf16 = "native bf16" if native_bf16() else "no native bf16"
    return f"{model}, {os.cpu_count()} cores, torch {torch.backends.cpu.get_cpu_capability()}, {bf16}"


def matmul_gflops(dtype=torch.float32, device="cpu", n=2048, seconds=1.0):
    """Best GFLOP/s of an n x n x n torch.mm over about `seconds`."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    torch.mm(a, b)
    sync()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def source_commit(repo=Path(__file__).resolve().parents[1]) -> Optional[str]:
    """The checkout's short commit, with "+changes" where tracked files differ from it (the
    figures are then not that commit's); None outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return None
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
