"""fairseq tasks of the ConvS2S plugin."""
from .convs2s_translation import ConvS2STranslationTask

__all__ = ["ConvS2STranslationTask"]
