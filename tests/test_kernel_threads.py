"""The runtime's C++ kernels (int8_linear, int8_rows_by_sentence, log_softmax_top_k) let other
Python threads run while they work, as torch's own operations do, and give the same numbers
when two threads call them at once: a server that translates in two threads is not serialized
on them."""
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from convs2s_serving import int8_linear, kernels, top_log_probs

CAPABILITY = torch.backends.cpu.get_cpu_capability()
pytestmark = pytest.mark.skipif(
    CAPABILITY not in kernels.CAPABILITY_FLAGS or shutil.which("c++") is None,
    reason=f"no kernel for torch's CPU capability {CAPABILITY} or no C++ compiler",
)


@pytest.fixture(scope="module")
def kernel_calls():
    """Each kernel's call on inputs of the benchmark's shapes (a beam step at beam 5, batch
    128), made ready beforehand: a call makes no torch operation from Python, which would
    release the GIL by itself."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(640, 256, generator=generator)
    weight_t = torch.randint(-63, 64, (9792, 256), generator=generator, dtype=torch.int8).t()
    scale, bias, out = torch.rand(9792, generator=generator) / 50, torch.randn(9792, generator=generator), \
        torch.empty(640, 9792)
    q = torch.randint(-63, 64, (128, 230, 256), generator=generator, dtype=torch.int8)
    own_scale, own_bias = torch.rand(128, 230, generator=generator) / 50, torch.randn(128, 230, generator=generator)
    h = torch.randn(128, 5, 256, generator=generator)
    logits = torch.randn(640, 9792, generator=generator) * 6
    linear, top = int8_linear.KERNEL.load(), top_log_probs.load()
    return {
        "int8_linear": lambda out=out: linear.int8_linear(x, weight_t, scale, bias, out),
        "int8_rows_by_sentence": lambda: linear.int8_rows_by_sentence(q, own_scale, own_bias, h),
        "log_softmax_top_k": lambda: top.log_softmax_top_k(logits, 4, 10, 9792),
    }


@pytest.mark.parametrize("name", ["int8_linear", "int8_rows_by_sentence", "log_softmax_top_k"])
def test_another_python_thread_runs_while_a_kernel_works(kernel_calls, name):
    """The interpreter's switch interval is made 100 s, so that a thread waiting for the GIL
    gets it only when the thread holding it releases it or blocks, never by time. The other
    thread is woken just before the calls and waits for the GIL: it runs before the calls
    have all returned only if a call released it (holding it, they ran 20 calls first)."""
    call, ran = kernel_calls[name], []
    go = threading.Event()
    other = threading.Thread(target=lambda: (go.wait(), ran.append("other")))
    previous = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        other.start()
        go.set()
        for _ in range(20):  # the other thread may need more than one call's time to be scheduled
            call()
            if ran:
                break
        ran.append("calls returned")
    finally:
        sys.setswitchinterval(previous)
        other.join(timeout=120)
    assert ran == ["other", "calls returned"], f"{name} held the GIL while it worked"


@pytest.mark.parametrize("name", ["int8_linear", "int8_rows_by_sentence", "log_softmax_top_k"])
def test_two_threads_at_once_get_the_numbers_of_one(kernel_calls, name):
    """Calls made side by side, each into its own output, give one call's numbers."""
    def call():
        if name == "int8_linear":  # the others make their outputs
            return kernel_calls[name](torch.empty(640, 9792))
        return kernel_calls[name]()

    expected = call()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: call(), range(8)))
    for got in results:
        if isinstance(got, torch.Tensor):
            assert torch.equal(got, expected)
        else:
            assert all(torch.equal(a, b) for a, b in zip(got, expected))
