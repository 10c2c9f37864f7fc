"""The lean beam step's kernel: torch.log_softmax's values at each row's special symbols and
its k best words, bit for bit, built where torch runs vectorized code, and torch's own
operations, with a warning, where it cannot be had."""
import os
import shutil

import pytest
import torch

from cli_helpers import in_python
from convs2s_serving import kernels, top_log_probs

CAPABILITY = torch.backends.cpu.get_cpu_capability()
needs_kernel = pytest.mark.skipif(
    CAPABILITY not in kernels.CAPABILITY_FLAGS or shutil.which("c++") is None,
    reason=f"no kernel for torch's CPU capability {CAPABILITY} or no C++ compiler",
)


def torch_ops(logits, nspecial, k):
    """The lean step's values without the kernel (which the lean step's tests compare with
    stock fairseq's search): torch.log_softmax, then the top k words."""
    return top_log_probs.top_k(torch.log_softmax(logits, dim=-1), nspecial, k)


@needs_kernel
def test_the_kernel_is_built_on_this_cpu():
    assert top_log_probs.load() is not None


@needs_kernel
def test_another_install_of_the_same_source_uses_the_built_kernel(tmp_path):
    """A second install (a wheel, another checkout) has the kernel's source at another path:
    it loads the kernel the first built, instead of rebuilding it (40 s) for both in turn."""
    top_log_probs.load()  # built for this install
    build = top_log_probs.build_directory(CAPABILITY)
    library = max(build.glob("*.so"), key=lambda path: path.stat().st_mtime)
    built = library.stat().st_mtime_ns
    other = tmp_path / "site-packages" / "top_log_probs.cpp"
    other.parent.mkdir()
    shutil.copy(top_log_probs.KERNEL.source, other)
    out = in_python("import logging; logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
                    "from pathlib import Path\n"
                    "from convs2s_serving import top_log_probs\n"
                    f"top_log_probs.KERNEL.source = Path({str(other)!r})\n"
                    "assert top_log_probs.load() is not None")
    assert "compiling" not in out, out
    assert library.stat().st_mtime_ns == built


@needs_kernel
def test_the_ninja_package_builds_whatever_path_holds(tmp_path):
    """torch runs the ninja it finds first on PATH. A system ninja and the environment's own
    (first on PATH where the environment is activated) hash the build command differently,
    so taking turns each rebuilt the kernel the other had built (45 s). The ninja package's
    is always the one run: another put first on PATH is not, and nothing is compiled again."""
    top_log_probs.load()
    build = top_log_probs.build_directory(CAPABILITY)
    library = max(build.glob("*.so"), key=lambda path: path.stat().st_mtime)
    built = library.stat().st_mtime_ns
    other = tmp_path / "bin" / "ninja"
    other.parent.mkdir()
    other.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\nexit 1\n")
    other.chmod(0o755)
    in_python("from convs2s_serving import top_log_probs\nassert top_log_probs.load() is not None",
              PATH=f"{other.parent}{os.pathsep}{os.environ['PATH']}")
    assert not (tmp_path / "ran").exists()
    assert library.stat().st_mtime_ns == built


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, width, k", [
    (1, 5, 1),  # narrower than a vector
    (7, 23, 10),  # a tail after the vectors
    (33, 720, 10),  # a sentence's candidates
    (640, 18280, 10),  # a word-level step
    (3, 10004, 40),  # beam 20
])
def test_the_same_values_and_words_as_log_softmax_and_topk(rows, width, k, threads):
    generator = torch.Generator().manual_seed(rows + width)
    logits = torch.randn(rows, width, generator=generator) * 6 + 40  # far from 0: x - max matters
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        log_probs, words = top_log_probs.log_softmax_top_k(logits, 4, k)
    finally:
        torch.set_num_threads(previous)
    expected_log_probs, expected_words = torch_ops(logits, 4, k)
    assert torch.equal(log_probs, expected_log_probs)
    assert torch.equal(words, expected_words)


@needs_kernel
def test_words_a_sentence_lacks_and_ties():
    """Vocabulary selection's padding (-inf logits) is never chosen while a row has words;
    among exactly tied logits any may be chosen, with the same log-probabilities."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(1))
    logits[:, 200:] = float("-inf")
    logits[:3, 20:40] = 5.0  # 20 tied best words
    log_probs, words = top_log_probs.log_softmax_top_k(logits, 4, 10)
    expected_log_probs, expected_words = torch_ops(logits, 4, 10)
    assert torch.equal(log_probs, expected_log_probs)
    assert words.lt(200).all() and torch.equal(words[3:], expected_words[3:])
    assert words[:3].ge(20).all() and words[:3].lt(40).all()


@pytest.mark.parametrize("use_kernel", [pytest.param(True, marks=needs_kernel), False])
def test_columns_that_are_not_words_count_in_the_normaliser_only(use_kernel):
    """Vocabulary selection's estimate of the words outside a sentence's candidates: the
    last columns, however large, are never among the best words, and the log-probabilities
    are the log_softmax over every column."""
    logits = torch.randn(6, 120, generator=torch.Generator().manual_seed(2))
    logits[:, 100:] += 8.0  # ahead of every word
    if use_kernel:
        log_probs, words = top_log_probs.log_softmax_top_k(logits, 4, 10, not_words=20)
    else:
        log_probs, words = top_log_probs.top_k(torch.log_softmax(logits, dim=-1), 4, 10, not_words=20)
    expected = logits[:, 4:100].topk(10, dim=1)
    assert torch.equal(words, expected.indices + 4)
    torch.testing.assert_close(log_probs[:, 4:], expected.values - logits.logsumexp(1, keepdim=True))
    assert log_probs.exp().sum(1).lt(0.2).all()


def test_other_tensors_are_left_to_torch():
    logits = torch.randn(4, 50)
    assert top_log_probs.log_softmax_top_k(logits.double(), 4, 10) is None
    assert top_log_probs.log_softmax_top_k(logits.t().contiguous().t(), 4, 10) is None  # not contiguous
    assert top_log_probs.log_softmax_top_k(logits.bfloat16(), 4, 10) is None


@needs_kernel
def test_a_lock_left_by_a_killed_build_does_not_hang_the_next():
    """torch's extension builds wait, forever, for a lock file that a killed build leaves."""
    top_log_probs.load()
    lock = top_log_probs.build_directory(CAPABILITY) / "lock"
    lock.touch()
    output = in_python("from convs2s_serving import top_log_probs as t; "
                       "print('kernel' if t.load() is not None else 'none')")
    assert output.split()[-1] == "kernel"
    assert not lock.exists()


def test_without_vectorized_code_torch_ops_do_the_work_with_a_warning():
    output = in_python("import logging; logging.basicConfig(); import torch; "
                       "from convs2s_serving import top_log_probs as t; "
                       "print(t.load(), t.log_softmax_top_k(torch.randn(2, 30), 4, 3))",
                       ATEN_CPU_CAPABILITY="default")
    assert "top_log_probs kernel is not used (no build for torch's CPU capability DEFAULT)" in output
    assert output.splitlines()[-1] == "None None"
