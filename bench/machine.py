"""The machine's measured matrix-multiply throughput, to read results as a fraction of peak."""
import time

import torch


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
