"""Data the ConvS2S plugin adds to fairseq's: the words of the sentences being translated
(unknown-word replacement) and the candidate target words of vocabulary selection."""
from convs2s_serving.candidates import NO_WORD

from .source_text import SourceTextDataset, SourceTextError, raw_lines
from .vocabulary_selection import CandidatesFileError, SelectionOptionError, VocabularySelection, local_indices

__all__ = ["NO_WORD", "CandidatesFileError", "SelectionOptionError", "SourceTextDataset", "SourceTextError",
           "VocabularySelection", "local_indices", "raw_lines"]
