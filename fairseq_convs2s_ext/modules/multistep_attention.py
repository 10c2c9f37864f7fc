"""Multi-step attention: each decoder layer attends on its own (section 3.3)."""
import torch
import torch.nn as nn

from .initialization import Linear
from .scaling import scaled_sum


class MultiStepAttention(nn.Module):
    """Attention of one decoder layer l.

    d_i = W_d h_i + b_d + g_i (the decoder state projected to the embedding size, plus the
    embedding g_i of the previous target element); a_ij = softmax_j(d_i . z_j) over the
    real (non-padding) source positions, with z the last encoder block's output;
    c_i = sum_j a_ij (z_j + e_j), scaled by m * sqrt(1/m) for a source of m real words
    (section 3.4); c_i is projected back to the layer's width and added to h_i. The sum
    forming d and the one adding c back to h are scaled by sqrt(0.5) as fconv does, not as
    the paper does (see ``scaling``).
    """

    def __init__(self, channels, embed_dim):
        super().__init__()
        self.in_projection = Linear(channels, embed_dim)
        self.out_projection = Linear(embed_dim, channels)

    def forward(self, h, target_embedding, encoder_out):
        """h: B x T x channels; target_embedding g: B x T x embed_dim.

        Returns the new h and the attention a (B x T x S). When ``encoder_out["beam"]`` is b,
        the encoder output has one row per b consecutive rows of h (the hypotheses of one
        sentence in beam search), and each source is read once for all of them.
        """
        keys, values = encoder_out["encoder_out"]
        padding_mask = encoder_out["encoder_padding_mask"]
        batch, steps, _ = h.shape
        d = scaled_sum(self.in_projection(h), target_embedding)
        d = d.reshape(keys.size(0), -1, d.size(-1))  # the b hypotheses of a sentence side by side
        scores = torch.bmm(d, keys.transpose(1, 2))
        if padding_mask is not None:
            scores = scores.masked_fill(padding_mask.unsqueeze(1), float("-inf"))
        a = torch.softmax(scores.float(), dim=-1).type_as(scores)
        c = torch.bmm(a, values)
        if padding_mask is None:
            m = torch.full((1, 1, 1), keys.size(1), dtype=c.dtype, device=c.device)
        else:
            m = (~padding_mask).sum(dim=1).to(c.dtype).view(-1, 1, 1)
        c = c * (m * torch.rsqrt(m))
        c, a = c.view(batch, steps, -1), a.view(batch, steps, -1)
        return scaled_sum(self.out_projection(c), h), a
