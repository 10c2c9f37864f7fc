"""The ConvS2S encoder (sections 3.1, 3.2, 3.4)."""
import torch
import torch.nn as nn
from fairseq.models import FairseqEncoder
from fairseq.modules import FairseqDropout, GradMultiply

from ..checkpoints.dictionaries import BUFFER, check_fingerprint, fingerprint
from ..modules import GLUConvolution, Linear, WordPositionEmbedding, scaled_sum


class ConvS2SEncoder(FairseqEncoder):
    """Embeddings e, a linear map to the first block's width, blocks of GLU convolutions with
    residual connections, and a linear map back to the embedding size giving z.

    Padding positions are zeroed before every convolution, so a sentence is encoded the same
    alone and in a padded batch. The gradient reaching the encoder through z is divided by
    the number of attention layers that read it (section 3.4), while the source embedding
    added to form the values z + e keeps its full gradient, as the paper says. fconv divides
    by twice that number (it counts keys and values as two uses), as the paper's Lua code did;
    we follow the paper's text. Both train alike (docs/paper-and-fconv.md).
    """

    def __init__(self, dictionary, embed_dim, layers, dropout, max_positions, num_attention_layers):
        super().__init__(dictionary)
        self.register_buffer(BUFFER, fingerprint(dictionary))  # checked on load
        self.padding_idx = dictionary.pad()
        self.embed = WordPositionEmbedding(len(dictionary), embed_dim, self.padding_idx, max_positions, dropout)
        self.dropout = FairseqDropout(dropout, module_name=type(self).__name__)
        self.gradient_scale = 1.0 / num_attention_layers
        channels = layers[0][0]
        self.fc1 = Linear(embed_dim, channels, dropout=dropout)
        self.residual_projections = nn.ModuleList()
        self.convolutions = nn.ModuleList()
        for out_channels, kernel_width in layers:
            self.residual_projections.append(nn.Identity() if out_channels == channels else Linear(channels, out_channels))
            self.convolutions.append(GLUConvolution(channels, out_channels, kernel_width, dropout))
            channels = out_channels
        self.fc2 = Linear(channels, embed_dim)
        self.share_source = True  # see reorder_encoder_out; False: one row per hypothesis, as fconv

    def forward(self, src_tokens, src_lengths=None):
        """src_tokens: B x S. Returns keys z and values z + e, both B x S x embed_dim (the
        values scaled by sqrt(0.5) as fconv does; the paper does not, see ``scaling``)."""
        e = self.embed(src_tokens)
        padding_mask = src_tokens.eq(self.padding_idx)
        if not torch.compiler.is_compiling() and not padding_mask.any():  # compiled: no branch on the data
            padding_mask = None
        x = self.fc1(e)
        for residual_projection, convolution in zip(self.residual_projections, self.convolutions):
            residual = residual_projection(x)
            if padding_mask is not None:
                x = x.masked_fill(padding_mask.unsqueeze(-1), 0)
            x = scaled_sum(convolution(self.dropout(x)), residual)
        z = self.fc2(x)
        if padding_mask is not None:
            z = z.masked_fill(padding_mask.unsqueeze(-1), 0)
        z = GradMultiply.apply(z, self.gradient_scale)
        return {"encoder_out": (z, scaled_sum(z, e)), "encoder_padding_mask": padding_mask}

    def upgrade_state_dict_named(self, state_dict, name):
        """Refuse a checkpoint trained with another source dictionary (see checkpoints.dictionaries)."""
        check_fingerprint(state_dict, f"{name}.{BUFFER}", self.dictionary, "source")
        return state_dict

    def reorder_encoder_out(self, encoder_out, new_order):
        """Row r of the decoder's batch now continues row new_order[r].

        Beam search gives each sentence several consecutive rows that read the same
        source. The encoder output keeps one row per sentence and says how many decoder
        rows share it (``"beam"``), so a beam's reordering, which stays within each
        sentence, copies nothing, and attention reads each source once per sentence
        (as fairseq's BeamableMM). Any other order, and every order without
        ``share_source``, gives one row per decoder row.
        """
        if not self.share_source:
            return self._select(encoder_out, new_order, 1)
        beam = encoder_out.get("beam", 1)
        rows = encoder_out["encoder_out"][0].size(0)
        sources = new_order.div(beam, rounding_mode="floor") if beam > 1 else new_order
        group = beam if beam > 1 else max(1, new_order.numel() // rows)
        if new_order.numel() % group == 0:
            grouped = sources.view(-1, group)
            first = grouped[:, 0]
            if torch.equal(grouped, first.unsqueeze(1).expand_as(grouped)):
                if first.numel() == rows and torch.equal(first, torch.arange(rows, device=first.device)):
                    return dict(encoder_out, beam=group)
                return self._select(encoder_out, first, group)
        return self._select(encoder_out, sources, 1)

    @staticmethod
    def _select(encoder_out, rows, beam):
        mask = encoder_out["encoder_padding_mask"]
        return {
            "encoder_out": tuple(t.index_select(0, rows) for t in encoder_out["encoder_out"]),
            "encoder_padding_mask": None if mask is None else mask.index_select(0, rows),
            "beam": beam,
        }

    def max_positions(self):
        return self.embed.max_positions
