"""fairseq tasks of the ConvS2S plugin."""
from . import generate_cli
from .convs2s_translation import ConvS2STranslationTask

generate_cli.install()

__all__ = ["ConvS2STranslationTask"]
