"""The words of the sentences being translated, for unknown-word replacement.

Binarized data keeps token ids only, so an unknown source word is lost: the replacement has
nothing to copy, and fairseq-generate has nothing to print for it. fairseq keeps the words
in its raw-text datasets (``--dataset-impl raw``: ``SPLIT.SRC-TGT.LANG`` text files, read
and numbered with the dictionary as they load, so their ids are those of the binaries).
convs2s-prepare keeps each evaluation split's binarized text beside the binaries under that
name, and fairseq-generate itself requires ``--dataset-impl raw`` with ``--replace-unk``.
fairseq-interactive has no dataset: its input lines are recorded by the task.
"""
from typing import List, Optional

from fairseq.data import BaseWrapperDataset
from fairseq.data.indexed_dataset import IndexedRawTextDataset


class SourceTextError(ValueError):
    """The words of a split are not available: it was not loaded from raw text."""


def raw_lines(dataset) -> Optional[List[str]]:
    """The text lines of a raw-text dataset, looking through wrappers (truncation, EOS
    handling); None if it was loaded from binaries."""
    while dataset is not None and not isinstance(dataset, IndexedRawTextDataset):
        dataset = getattr(dataset, "dataset", None)
    return None if dataset is None else dataset.lines


class OriginalText:
    """What fairseq-generate asks a dataset's ``src`` and ``tgt`` for when it replaces
    unknown words: ``get_original_text(index)``."""

    def __init__(self, lines: List[str]):
        self.lines = lines

    def get_original_text(self, index: int) -> str:
        return self.lines[index]


class SourceTextDataset(BaseWrapperDataset):
    """A language-pair dataset with the original text of its sentences.

    Its batches carry the source lines as ``src_text`` (and are handed to ``on_batch`` when
    given); ``src`` and ``tgt`` give fairseq-generate the text to print.
    """

    def __init__(self, pairs, src_lines: List[str], tgt_lines: Optional[List[str]] = None,
                 on_batch=None):
        super().__init__(pairs)
        self.src = OriginalText(src_lines)
        self.tgt = OriginalText(tgt_lines) if tgt_lines is not None else None
        self.on_batch = on_batch

    def collater(self, samples):
        batch = super().collater(samples)
        if batch:  # an empty list of samples collates to {}
            batch["src_text"] = [self.src.lines[i] for i in batch["id"].tolist()]
            if self.on_batch is not None:
                self.on_batch(batch)
        return batch
