from .convs2s import ConvS2SModel
from .convs2s_decoder import ConvS2SDecoder
from .convs2s_encoder import ConvS2SEncoder

__all__ = ["ConvS2SDecoder", "ConvS2SEncoder", "ConvS2SModel"]
