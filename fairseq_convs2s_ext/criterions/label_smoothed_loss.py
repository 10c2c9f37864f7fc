"""Label-smoothed cross entropy from the logits, in two implementations with the same numbers.

The loss is fairseq's ``label_smoothed_nll_loss(log_softmax(logits), target, eps)``: for a
target y over V words, with eps_i = eps / (V - 1),

    nll = logsumexp(x) - x_y
    loss = (1 - eps - eps_i) * nll + eps_i * (V * logsumexp(x) - sum_j x_j).

- ``"fused"``: torch's ``F.cross_entropy`` with label smoothing s, whose loss is
  (1 - s) nll + (s / V) sum_j -log p_j: with s = eps V / (V - 1) the weights are fairseq's.
  On a GPU it is a few kernels over the whole (target tokens x V) matrix.
- ``"blockwise"``: :mod:`.blockwise_cross_entropy`, each block of rows read once while it
  stays in cache: fewer passes over memory, more (smaller) operations.

Which is faster depends on the device (``hardware.FASTEST``); ``"auto"`` takes that choice
from the logits' device. Both compute in fp32, as fairseq's criterion does (its log_softmax
is in fp32 whatever the model's dtype).
"""
import torch
import torch.nn.functional as F

from ..hardware import fastest
from .blockwise_cross_entropy import BlockwiseLabelSmoothedCrossEntropy

IMPLEMENTATIONS = ("auto", "fused", "blockwise")


def label_smoothed_cross_entropy(logits, target, epsilon, ignore_index, implementation="auto", reduce=True):
    """(loss, nll) of ``logits`` (... x V) against ``target`` (...): summed, or per token
    (flattened) when not ``reduce``; 0 at ``ignore_index``. ``nll`` is logged, not trained:
    the fused implementation gives it no gradient."""
    logits, target = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
    if implementation == "auto":
        implementation = fastest("loss", logits.device.type)
    if implementation == "blockwise":
        loss, nll = BlockwiseLabelSmoothedCrossEntropy.apply(logits, target, epsilon, ignore_index)
        return (loss.sum(), nll.sum()) if reduce else (loss, nll)
    if implementation != "fused":
        raise ValueError(f"loss implementation {implementation!r}: one of {', '.join(IMPLEMENTATIONS)}")
    return fused_label_smoothed_cross_entropy(logits, target, epsilon, ignore_index, "sum" if reduce else "none")


def fused_label_smoothed_cross_entropy(logits, target, epsilon, ignore_index, reduction):
    """(loss, nll) of ``logits`` (N x V) through ``F.cross_entropy`` (``reduction``: "sum" or "none")."""
    vocab = logits.size(-1)
    logits = logits.float()
    smoothing = epsilon * vocab / (vocab - 1)
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=smoothing, reduction=reduction)
    if epsilon == 0:
        return loss, loss.detach()
    with torch.no_grad():
        nll = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)
    return loss, nll
