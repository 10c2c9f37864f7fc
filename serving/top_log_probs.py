"""Each hypothesis's log-probabilities at the special symbols and its k best words, in one
read of its logits: a beam step's work over the vocabulary, on a CPU (the plugin's lean beam
step's and ``convs2s-serve``'s).

torch offers it as two operations: ``torch.log_softmax`` reads the hypotheses x V logits
and writes as many log-probabilities, then ``torch.topk`` reads them again and copies each
row into (value, index) pairs before sorting. The kernel in ``top_log_probs.cpp`` reads a
row once from memory, finding its maximum and its k largest logits in that one pass, then
sums exp(x - max) from cache with the functions torch's own log_softmax calls, in the same
order; only the nspecial + k log-probabilities a row needs are written, the same values,
bit for bit, as torch's (bench/README.md as of 86165d7~, "What each lever bought", times it
against torch's two operations).

It is compiled on first use (:mod:`.kernels`) and used only after it has matched
``torch.log_softmax`` and ``torch.topk`` on random rows. Where it cannot be built, loaded or
matched, the lean step uses torch's two operations, with a warning that says why.
"""
from typing import Optional, Tuple

import torch

from .kernels import Kernel


def log_softmax_top_k(logits: torch.Tensor, nspecial: int, k: int,
                      not_words: int = 0) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(log-probabilities of the first nspecial columns and of the k best others, best
    first; those k columns)`` of each row of ``logits`` (hypotheses x columns), the values of
    ``torch.log_softmax``; the last ``not_words`` columns count in its normaliser but are not
    words, never among the best. None where the kernel does not apply (not a contiguous
    float32 CPU tensor, or no kernel on this machine): the caller then computes the
    log-probabilities with torch and takes :func:`top_k` of them."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or not logits.is_contiguous():
        return None
    kernel = load()
    if kernel is None:
        return None
    return tuple(kernel.log_softmax_top_k(logits, nspecial, k, logits.size(1) - not_words))


def top_k(log_probs: torch.Tensor, nspecial: int, k: int, not_words: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """What :func:`log_softmax_top_k` returns, from log-probabilities that torch computed."""
    best = log_probs[:, nspecial: log_probs.size(1) - not_words].topk(k, dim=1)
    return torch.cat([log_probs[:, :nspecial], best.values], dim=1), best.indices + nspecial


def load():
    """The compiled kernel, built on the first call of a process if need be; None where it
    cannot be had (the reason is logged once)."""
    return KERNEL.load()


def build_directory(capability: str):
    """Where the kernel for ``capability`` and this torch and Python is built."""
    return KERNEL.build_directory(capability)


def _mismatch(kernel) -> Optional[str]:
    """The first shape (rows x words) on which the kernel differs from torch's two operations
    by a bit, if any: widths around the vector size, a vocabulary selection's and a word
    level's."""
    generator = torch.Generator().manual_seed(0)
    for rows, width, scale, not_words in [(3, 14, 1.0, 0), (5, 23, 4.0, 0), (64, 720, 5.0, 64), (40, 18283, 3.0, 0)]:
        logits = torch.randn(rows, width, generator=generator) * scale
        nspecial, k = 4, min(10, width - 4)
        found = kernel.log_softmax_top_k(logits, nspecial, k, width - not_words)
        expected = top_k(torch.log_softmax(logits, dim=-1), nspecial, k, not_words)
        if not all(map(torch.equal, found, expected)):
            return f"{rows} x {width}"
    return None


KERNEL = Kernel("top_log_probs", _mismatch, "torch.log_softmax and torch.topk do its work, more slowly")
