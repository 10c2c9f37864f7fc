"""Variance-preserving sums: (a + b) * sqrt(0.5).

The paper scales one kind of sum (section 3.4): "We multiply the sum of the input and
output of a residual block by sqrt(0.5) to halve the variance of the sum", a block's output
and its residual.

fairseq's ``fconv`` scales three more sums by sqrt(0.5) where the paper adds plainly, and
we follow fconv there so that checkpoints imported with ``convs2s-import-fconv`` compute the
same numbers:

- the attention query d_i = W_d h_i + b_d + g_i (section 3.3). On d the factor is not
  harmless: it multiplies every score d_i . z_j by sqrt(0.5), a softmax temperature of
  sqrt(2) that the paper does not have;
- the attention values z_j + e_j;
- the attention's output added back to h_i.
"""
import math

import torch

SQRT_HALF = math.sqrt(0.5)


def scaled_sum(a, b):
    """(a + b) * sqrt(0.5), scaled in place: one new tensor instead of two."""
    return torch.add(a, b).mul_(SQRT_HALF)
