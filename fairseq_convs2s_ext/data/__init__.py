"""Dataset wrappers of the ConvS2S plugin."""
from .source_text import SourceTextDataset, SourceTextError, raw_lines

__all__ = ["SourceTextDataset", "SourceTextError", "raw_lines"]
