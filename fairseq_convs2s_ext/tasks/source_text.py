"""The original text of binarized sentences, for unknown-word replacement.

Binarized data keeps token ids only, so an unknown source word is lost: the replacement has
nothing to copy, and fairseq-generate has nothing to print for it. fairseq keeps the text only
in its raw-text format (``--dataset-impl raw``). Our convention for binarized data: each
split's text lies beside its binary files, one sentence a line, as

    {split}.{src}-{tgt}.{lang}.txt      e.g. test.en-de.en.txt and test.en-de.de.txt

holding exactly the text fairseq-preprocess binarized for that split (tokenized, and
BPE-segmented if the model uses BPE). The ``.txt`` suffix matters: without it fairseq would
take the file for a raw-text dataset (``{split}.{src}-{tgt}.{lang}``) and infer
``--dataset-impl raw``. As for the binary files, the pair may also be named the other way
round (``test.de-en.en.txt``).
"""
import os
from typing import List, Optional

from fairseq.data import BaseWrapperDataset
from fairseq.tokenizer import tokenize_line

TEXT_SUFFIX = ".txt"


class SourceTextError(FileNotFoundError):
    """The text of a split is missing or is not the text that was binarized."""


def text_path(data_path: str, split: str, src: str, tgt: str, lang: str) -> str:
    """Where the text of ``split`` in ``lang`` lies: the first of ``{split}.{src}-{tgt}.{lang}.txt``
    and ``{split}.{tgt}-{src}.{lang}.txt`` that exists, else the first."""
    names = [f"{split}.{pair}.{lang}{TEXT_SUFFIX}" for pair in (f"{src}-{tgt}", f"{tgt}-{src}")]
    paths = [os.path.join(data_path, name) for name in names]
    return next((path for path in paths if os.path.exists(path)), paths[0])


def read_text(path: str, sizes, max_tokens: Optional[int] = None) -> List[str]:
    """The lines of ``path``, checked against the binarized sentences' lengths ``sizes``
    (words + end of sentence, at most ``max_tokens`` when the source was truncated)."""
    if not os.path.exists(path):
        raise SourceTextError(
            f"unknown-word replacement needs the text of the sentences, which binarized data "
            f"does not keep, and {path} does not exist. Write there the text that "
            f"fairseq-preprocess binarized for this split (tokenized, BPE-segmented if any), "
            f"one sentence a line; e.g. cp test.tok.en {path}"
        )
    with open(path, encoding="utf-8") as f:  # lines split as fairseq-preprocess splits them
        lines = [line.rstrip("\n") for line in f]
    if len(lines) != len(sizes):
        raise SourceTextError(f"{path} has {len(lines)} lines, the binarized split "
                              f"{len(sizes)} sentences: it is not the text that was binarized")
    for number, (line, size) in enumerate(zip(lines, sizes), 1):
        words = len(tokenize_line(line))
        expected = words + 1 if max_tokens is None else min(words + 1, max_tokens)
        if expected != size:
            raise SourceTextError(f"line {number} of {path} has {words} tokens, the binarized "
                                  f"sentence {size - 1} and an end of sentence: it is not the "
                                  f"text that was binarized")
    return lines


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
