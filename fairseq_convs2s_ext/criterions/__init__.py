"""fairseq criteria of the ConvS2S plugin."""
from .convs2s_cross_entropy import ConvS2SCrossEntropyCriterion

__all__ = ["ConvS2SCrossEntropyCriterion"]
