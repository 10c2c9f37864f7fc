"""Multi-step attention: each decoder layer attends on its own (section 3.3)."""
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .initialization import Linear
from .scaling import SQRT_HALF, scaled_sum


class ProjectedSource(NamedTuple):
    """One layer's projections of the source (:meth:`MultiStepAttention.project_source`),
    a row per row of the encoder output; the keys transposed, source positions last, as a
    step multiplies them (stored so, the products took half the time of their transposed
    views)."""
    embedding_keys: torch.Tensor  # sqrt(0.5) z_j, B x embed_dim x S
    keys: torch.Tensor  # sqrt(0.5) W_d^T z_j, B x channels x S
    key_bias: torch.Tensor  # sqrt(0.5) b_d . z_j, -inf at padding, B x 1 x S
    values: torch.Tensor  # W_c (z_j + e_j) times m * sqrt(1/m), plus b_c, B x S x channels


class MultiStepAttention(nn.Module):
    """Attention of one decoder layer l.

    d_i = W_d h_i + b_d + g_i (the decoder state projected to the embedding size, plus the
    embedding g_i of the previous target element); a_ij = softmax_j(d_i . z_j) over the
    real (non-padding) source positions, with z the last encoder block's output;
    c_i = sum_j a_ij (z_j + e_j), scaled by m * sqrt(1/m) for a source of m real words
    (section 3.4); c_i is projected back to the layer's width (W_c c_i + b_c) and added to
    h_i. The sum forming d and the one adding c back to h are scaled by sqrt(0.5) as fconv
    does, not as the paper does (see ``scaling``).

    In a beam search the projections can move onto the source (:meth:`project_source`):
    d_i . z_j = h_i . (W_d^T z_j) + (b_d + g_i) . z_j and, as the a_ij sum to 1,
    W_c c_i + b_c = sum_j a_ij (W_c (z_j + e_j) + b_c), so each source position is projected
    once per sentence instead of each hypothesis at every step. The numbers are the same up
    to rounding.
    """

    def __init__(self, channels, embed_dim):
        super().__init__()
        self.in_projection = Linear(channels, embed_dim)
        self.out_projection = Linear(embed_dim, channels)

    def forward(self, h, target_embedding, encoder_out, source=None):
        """h: B x T x channels; target_embedding g: B x T x embed_dim; ``source``: this
        layer's :meth:`project_source` of ``encoder_out``, or None.

        Returns the new h and the attention a (B x T x S). When ``encoder_out["beam"]`` is b,
        the encoder output has one row per b consecutive rows of h (the hypotheses of one
        sentence in beam search), and each source is read once for all of them.
        """
        keys, values = encoder_out["encoder_out"]
        padding_mask = encoder_out["encoder_padding_mask"]
        batch, steps, _ = h.shape
        by_source = keys.size(0), -1  # the b hypotheses of a sentence side by side
        if source is None:
            d = scaled_sum(self.in_projection(h), target_embedding)
            scores = torch.bmm(d.reshape(*by_source, d.size(-1)), keys.transpose(1, 2))
            if padding_mask is not None:
                scores = scores.masked_fill(padding_mask.unsqueeze(1), float("-inf"))
        else:  # the key bias is -inf at padding
            g = target_embedding.reshape(*by_source, target_embedding.size(-1))
            scores = torch.baddbmm(source.key_bias, g, source.embedding_keys)
            scores = scores.baddbmm_(h.reshape(*by_source, h.size(-1)), source.keys)
        a = torch.softmax(scores.float(), dim=-1).type_as(scores)
        if source is None:
            c = torch.bmm(a, values) * conditional_input_scale(keys, padding_mask)
            out = self.out_projection(c.view(batch, steps, -1))
        else:
            out = torch.bmm(a, source.values).view(batch, steps, -1)
        return scaled_sum(out, h), a.view(batch, steps, -1)

    def project_source(self, encoder_out):
        """The source through this layer's projections: keys z_j (for g_i) and W_d^T z_j (for
        h_i) and key bias b_d . z_j, all times fconv's sqrt(0.5); values W_c (z_j + e_j) times
        m * sqrt(1/m), plus b_c; one row per row of the encoder output. The key bias is -inf at
        padding positions, which masks them at every step without a pass of its own."""
        keys, values = encoder_out["encoder_out"]
        padding_mask = encoder_out["encoder_padding_mask"]
        key_bias = torch.matmul(keys, self.in_projection.bias).mul_(SQRT_HALF)
        if padding_mask is not None:
            key_bias.masked_fill_(padding_mask, float("-inf"))
        scale = conditional_input_scale(keys, padding_mask)
        return ProjectedSource(
            embedding_keys=(keys.transpose(1, 2) * SQRT_HALF).contiguous(),
            keys=self.project_keys(keys),
            key_bias=key_bias.unsqueeze(1),
            values=self.project_values(values).mul_(scale).add(self.out_projection.bias),
        )

    def project_keys(self, z):
        """sqrt(0.5) W_d^T z_j for each row z_j of z (B x S x embed_dim): B x channels x S."""
        return torch.matmul(self.in_projection.weight.transpose(0, 1), z.transpose(1, 2)).mul_(SQRT_HALF)

    def project_values(self, v):
        """W_c v_j, without b_c, for each row v_j of v (B x S x embed_dim): B x S x channels."""
        return F.linear(v, self.out_projection.weight)


def conditional_input_scale(keys, padding_mask):
    """m * sqrt(1/m) for each source of m real words (section 3.4), as B x 1 x 1."""
    if padding_mask is None:
        m = torch.full((1, 1, 1), keys.size(1), dtype=keys.dtype, device=keys.device)
    else:
        m = (~padding_mask).sum(dim=1).to(keys.dtype).view(-1, 1, 1)
    return m * torch.rsqrt(m)
