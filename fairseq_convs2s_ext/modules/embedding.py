"""Word plus position embeddings (section 3.1)."""
import torch.nn as nn
from fairseq.modules import FairseqDropout, LearnedPositionalEmbedding

from .initialization import Embedding


class WordPositionEmbedding(nn.Module):
    """e_j = w_j + p_j, then dropout (section 3.4).

    Positions count from padding_idx + 1 on the real tokens only (fairseq's
    ``make_positions``), so left padding leaves a sentence's embeddings unchanged. The
    table holds ``max_positions`` positions: all of them usable (fconv's holds two fewer).
    """

    def __init__(self, num_embeddings, embed_dim, padding_idx, max_positions, dropout):
        super().__init__()
        self.max_positions = max_positions
        self.tokens = Embedding(num_embeddings, embed_dim, padding_idx)
        self.positions = LearnedPositionalEmbedding(max_positions + padding_idx + 1, embed_dim, padding_idx)
        nn.init.normal_(self.positions.weight, 0, 0.1)
        nn.init.zeros_(self.positions.weight[padding_idx])
        self.dropout = FairseqDropout(dropout, module_name=type(self).__name__)

    def forward(self, tokens, incremental_state=None):
        """tokens: B x T; in incremental mode, the whole prefix (only its last step is embedded)."""
        if tokens.size(1) > self.max_positions:
            raise ValueError(
                f"a sequence of {tokens.size(1)} tokens is longer than the model's {self.max_positions} "
                "positions: skip such inputs with --skip-invalid-size-inputs-valid-test, or train a model "
                "with larger --max-source-positions / --max-target-positions"
            )
        p = self.positions(tokens, incremental_state)
        if incremental_state is not None:
            tokens = tokens[:, -1:]
        return self.dropout(self.tokens(tokens) + p)
