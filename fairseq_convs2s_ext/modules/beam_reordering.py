"""fairseq's reordering of a beam search's hypotheses, read sentence by sentence.

At every step fairseq's SequenceGenerator hands the decoder ``new_order``: the hypothesis
rows to keep, in which a sentence's b hypotheses are consecutive rows and the sentences keep
their order, a finished sentence's rows left out. What is kept once per sentence instead of
once per hypothesis (the attentions' projected sources, each sentence's rows of W_o, each
sentence's candidates) follows the sentences, not the rows.
"""
from typing import Optional

import torch


def sentences_kept(new_order: torch.Tensor, beam: int, sentences: int) -> Optional[torch.Tensor]:
    """The sentences that ``new_order`` keeps (``beam`` hypotheses a sentence): their places
    among the ``sentences`` before, or None when no sentence finished."""
    if new_order.numel() == sentences * beam:
        return None
    return new_order[::beam] // beam


def keep_rows_(tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The ``rows`` of ``tensor`` (increasing indices) moved down in place to its first rows,
    which are returned: no second copy is made."""
    for i, r in enumerate(rows.tolist()):
        assert r >= i, "fairseq keeps the sentences left in their order"
        if r != i:
            tensor[i].copy_(tensor[r])
    return tensor[: len(rows)]
