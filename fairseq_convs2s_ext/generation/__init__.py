"""What generation adds to fairseq's SequenceGenerator for ConvS2S models: the lean beam step
(with vocabulary selection riding on it) and the paper's unknown-word replacement; and, for
every model, fairseq's own options that fail inside fairseq, repaired (:mod:`.fairseq_options`)."""
from .lean_beam_step import LeanSequenceGenerator, LeanSequenceGeneratorWithAlignment
from .unknown_words import UnknownWordReplacer

__all__ = ["LeanSequenceGenerator", "LeanSequenceGeneratorWithAlignment", "UnknownWordReplacer"]
