"""What generation adds to fairseq's SequenceGenerator for ConvS2S models."""
from .lean_beam_step import LeanSequenceGenerator, LeanSequenceGeneratorWithAlignment

__all__ = ["LeanSequenceGenerator", "LeanSequenceGeneratorWithAlignment"]
