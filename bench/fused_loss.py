"""A fused label-smoothed cross entropy, to measure what the loss costs (bench only).

fairseq's label_smoothed_cross_entropy takes log_softmax over the whole
(target tokens x vocabulary) matrix in fp32, gathers and sums it, and its backward
materializes a zero matrix, scatters into it, adds the smoothing term and runs
log_softmax's backward: about fifteen full passes over a matrix of 40M floats per
4000-token batch, as much time as the bf16 matrix multiplies of the whole model. This
computes the same loss and gradient from the logits in blocks of rows that stay in
cache: logsumexp, the target logit and the row sum forward, softmax minus the smoothed
target backward, reading the (bf16) logits once each way.

It is not the project's criterion (fairseq_convs2s_ext/criterions belongs to the
criterion work); ``bench/benchmark.py --fused-loss`` adds a run of ours with it to show
what adopting it there would buy.
"""
import math

import torch

ROWS = 256  # a block of 256 x 10k fp32 logits is 10 MB: it stays in the L2/L3 caches


class LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed (label-smoothed loss, nll) over non-padding targets, as fairseq's
    label_smoothed_nll_loss(log_softmax(logits), target, epsilon, ignore_index)."""

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):
        vocab = logits.size(-1)
        lse = torch.empty(logits.size(0), device=logits.device)
        nll = torch.empty_like(lse)
        smooth = torch.empty_like(lse)
        for start in range(0, logits.size(0), ROWS):
            x = logits[start : start + ROWS].float()
            rows = slice(start, start + x.size(0))
            lse[rows] = torch.logsumexp(x, dim=-1)
            nll[rows] = lse[rows] - x.gather(-1, target[rows, None]).squeeze(-1)
            smooth[rows] = vocab * lse[rows] - x.sum(-1)
        keep = target.ne(ignore_index)
        eps_i = epsilon / (vocab - 1)
        nll, smooth = nll * keep, smooth * keep
        ctx.save_for_backward(logits, target, lse, keep)
        ctx.epsilon = epsilon
        return (1 - epsilon - eps_i) * nll.sum() + eps_i * smooth.sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        logits, target, lse, keep = ctx.saved_tensors
        vocab, epsilon = logits.size(-1), ctx.epsilon
        eps_i = epsilon / (vocab - 1)
        on_target = 1 - epsilon - eps_i
        # d loss / d x_j = on_target * (p_j - [j = t]) + eps_i * (V p_j - 1)
        grad = torch.empty_like(logits)
        scale = (grad_loss * keep).float()
        for start in range(0, logits.size(0), ROWS):
            rows = slice(start, start + ROWS)
            x = logits[rows].float()
            g = torch.exp(x - lse[rows, None]).mul_(on_target + eps_i * vocab).sub_(eps_i)
            g.scatter_add_(-1, target[rows, None], torch.full_like(target[rows, None], -on_target, dtype=g.dtype))
            grad[rows] = g.mul_(scale[rows, None])
        return grad, None, None, None


def fused_criterion(task, label_smoothing=0.1):
    """A fairseq-style criterion callable: (model, sample) -> (loss, sample_size, logging)."""
    padding_idx = task.target_dictionary.pad()

    def criterion(model, sample):
        logits = model(**sample["net_input"])[0]
        target = model.get_targets(sample, None).view(-1)
        loss, nll = LabelSmoothedCrossEntropy.apply(logits.view(-1, logits.size(-1)), target, label_smoothing,
                                                    padding_idx)
        return loss, sample["ntokens"], {"loss": loss.data, "nll_loss": nll.data}

    return criterion


def _check(vocab=50, rows=600):
    """Same loss and gradient as fairseq's criterion (python -m bench.fused_loss)."""
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    x = torch.randn(rows, vocab, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, vocab, (rows,))
    t[::7] = 1
    ref, ref_nll = label_smoothed_nll_loss(torch.log_softmax(x, -1), t, 0.1, ignore_index=1)
    ref.backward()
    expected = x.grad.clone()
    x.grad = None
    loss, nll = LabelSmoothedCrossEntropy.apply(x, t, 0.1, 1)
    loss.backward()
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-6) and math.isclose(nll.item(), ref_nll.item(), rel_tol=1e-6)
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-6)
    print("fused loss == fairseq's label_smoothed_nll_loss (value and gradient)")


if __name__ == "__main__":
    _check()
