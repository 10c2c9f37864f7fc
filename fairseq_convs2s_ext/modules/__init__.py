"""The building blocks of ConvS2S, one concept a module."""
from .glu_convolution import GLUConvolution
from .embedding import WordPositionEmbedding
from .initialization import Embedding, Linear
from .layer_spec import parse_attention, parse_layers
from .multistep_attention import MultiStepAttention
from .scaling import scaled_sum

__all__ = ["Embedding", "GLUConvolution", "Linear", "MultiStepAttention", "parse_attention", "parse_layers", "scaled_sum", "WordPositionEmbedding"]
