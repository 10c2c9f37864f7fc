"""A convolution followed by a gated linear unit (section 3.2).

The paper writes the convolution as a linear map of the concatenated window of k inputs,
W in R^{2d x kd}, and so does this module: the weight is stored in that linearized form,
training applies it to every window at once, and incremental decoding applies it to a
buffer of the last k inputs. No weight is ever reshaped, so nothing needs re-deriving per
step (fairseq's ``LinearizedConvolution`` lost its cache of the reshaped weight, issue 3838).
Generation folds weight normalization into a plain weight first (``make_generation_fast_``,
which fairseq's commands and hub call); other callers that decode step by step can wrap
decoding in ``torch.nn.utils.parametrize.cached()``.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state

from .initialization import Linear


@with_incremental_state
class GLUConvolution(nn.Module):
    """v(W [X_{i-k/2} .. X_{i+k/2}] + b_w) with v([A B]) = A * sigmoid(B).

    Inputs and outputs are B x T x C. Encoder convolutions pad (k-1)//2 on the left and
    k//2 on the right, so outputs line up with inputs for odd and even k. Causal
    (decoder) convolutions pad k-1 on the left only: output i sees inputs i-k+1 .. i,
    which is the paper's "pad k-1 on both sides and remove k-1 outputs at the end".
    """

    def __init__(self, in_channels, out_channels, kernel_width, dropout=0.0, causal=False):
        super().__init__()
        self.in_channels = in_channels
        self.kernel_width = kernel_width
        self.causal = causal
        self.padding = (kernel_width - 1, 0) if causal else ((kernel_width - 1) // 2, kernel_width // 2)
        self.linear = Linear(kernel_width * in_channels, 2 * out_channels, dropout=dropout, glu=True)

    def forward(self, x, incremental_state=None):
        if incremental_state is not None:
            return self._step(x, incremental_state)
        k, (batch, length, channels) = self.kernel_width, x.shape
        if k > 1:  # each position's window of k inputs is k x C consecutive numbers of the padded x
            padded = F.pad(x, (0, 0) + self.padding)
            if torch.compiler.is_compiling() and x.device.type == "cpu":
                # compiled for a CPU (convs2s-export, --compile): the same numbers as k shifted slices, which
                # inductor copies a vector at a time; unfold's windows it copied a number at a time, dividing
                # each index by the length (docs/performance.md). On a GPU unmeasured: unfold kept there.
                windows = torch.cat([padded[:, j: j + length] for j in range(k)], dim=2)
            else:
                windows = padded.flatten(1).unfold(1, k * channels, channels)
            x = windows.reshape(batch * length, k * channels)  # copied once, then one product
        return F.glu(self.linear(x), dim=-1).view(batch, length, -1)

    def _step(self, x, incremental_state):
        """One causal step: x is B x 1 x C; the last k inputs are kept in a buffer."""
        assert self.causal, "incremental decoding needs a causal convolution"
        k = self.kernel_width
        if k > 1:
            x = self._moved_window(x, incremental_state).view(x.size(0), 1, k * self.in_channels)
        return F.glu(self.linear(x), dim=-1)

    def _moved_window(self, x, incremental_state):
        """The window of the last k inputs moved on by x (B x k x C, x last). A beam search's
        reorders of the hypotheses since the last step (:meth:`reorder_incremental_state`
        keeps them, composed) are applied as it moves: one gather of the k - 1 inputs kept
        into one of two buffers that the steps take in turn. Reordering the window, then
        moving it into a new tensor, copied it twice and allocated it twice a step (6% of
        an int8 beam search at beam 5, batch 128)."""
        window = self.get_incremental_state(incremental_state, "window")
        order = self.get_incremental_state(incremental_state, "window_order")
        buffers = self.get_incremental_state(incremental_state, "window_buffers")
        rows = x.size(0)
        if buffers is None or buffers[0].size(0) < rows:
            buffers = [x.new_empty(rows, self.kernel_width, self.in_channels) for _ in range(2)]
        moved = buffers[0][:rows]
        if window is None:
            moved[:, :-1].zero_()
        elif order is None:
            moved[:, :-1].copy_(window[:, 1:])
        else:
            torch.index_select(window[:, 1:], 0, order, out=moved[:, :-1])
        moved[:, -1:].copy_(x)
        self.set_incremental_state(incremental_state, "window", moved)
        self.set_incremental_state(incremental_state, "window_order", None)
        self.set_incremental_state(incremental_state, "window_buffers", buffers[::-1])  # the other's turn
        return moved

    def reorder_incremental_state(self, incremental_state, new_order):
        """Row r of the window continues row new_order[r]: kept, to be applied as the window
        moves at the next step."""
        if self.get_incremental_state(incremental_state, "window") is not None:
            order = self.get_incremental_state(incremental_state, "window_order")
            self.set_incremental_state(incremental_state, "window_order",
                                       new_order if order is None else order.index_select(0, new_order))
