"""Data the ConvS2S plugin adds to fairseq's: the candidate target words of vocabulary selection."""
from .vocabulary_selection import CandidatesFileError, VocabularySelection, local_indices

__all__ = ["CandidatesFileError", "VocabularySelection", "local_indices"]
