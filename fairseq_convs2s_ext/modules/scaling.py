"""Variance-preserving sums (section 3.4).

"We multiply the sum of the input and output of a residual block by sqrt(0.5) to halve the
variance of the sum." The same scaling applies wherever two terms of similar variance are
added: a block's output and its residual, the projected decoder state and the target
embedding that form the attention query d, the attention output and its input, and the
encoder output z and the source embedding e that form the attention values.
"""
import math

import torch

SQRT_HALF = math.sqrt(0.5)


def scaled_sum(a, b):
    """(a + b) * sqrt(0.5), scaled in place: one new tensor instead of two."""
    return torch.add(a, b).mul_(SQRT_HALF)
