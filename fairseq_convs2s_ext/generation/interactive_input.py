"""fairseq-interactive's input lines, as the task's hooks see them.

fairseq-interactive reads its input in buffers of lines, encodes them
(``get_interactive_tokens_and_lengths``), builds a dataset of their ids
(``build_dataset_for_inference``) and translates its batches (``inference_step``), passing
each hook only what fairseq needs. :class:`InteractiveInput` keeps what the hooks between
them do not pass on:

- each buffer's lines, so that an input line longer than the model takes is reported on
  stderr with its number and skipped, and the lines after it are translated (fairseq would
  stop at it with a traceback);
- with unknown-word replacement, the encoded text of each batch as it is collated, which
  reaches the replacement instead of the ids fairseq rebuilds its source string from (where
  every unknown word reads ``<unk>``; its S- lines still do).
"""
import sys
from collections import deque

import numpy as np
import torch

from ..data import SourceTextDataset


class InteractiveInput:
    def __init__(self):
        self.buffer = None  # (token tensors, encoded lines, input lines) of the current buffer
        self.lines_before = 0  # input lines before the current buffer
        self.collated = deque()  # batches collated and not yet translated

    def read(self, lines, encode_fn, tokens_and_lengths):
        """The tokens and lengths of a buffer of input ``lines``, encoded by ``encode_fn``
        (``--tokenizer``, ``--bpe``) and turned into ids by ``tokens_and_lengths``; the
        buffer's lines are kept."""
        if self.buffer is not None:
            self.lines_before += len(self.buffer[2])
        encoded = [encode_fn(line) for line in lines]
        tokens, lengths = tokens_and_lengths(encoded, lambda line: line)
        self.buffer = (tokens, encoded, list(lines))
        return tokens, lengths

    def dataset(self, dataset, src_tokens, with_text: bool):
        """``dataset`` built of ``src_tokens``: if they are the current buffer's, it knows its
        input lines (``input_lines``) and, ``with_text``, records the text of each batch it
        collates."""
        if self.buffer is None or self.buffer[0] is not src_tokens:
            return dataset  # not fairseq-interactive's lines: their text is unknown
        if with_text:
            dataset = SourceTextDataset(dataset, self.buffer[1], on_batch=self.collated.append)
        dataset.input_lines = self.buffer[2]
        return dataset

    def report_too_long(self, dataset, max_positions):
        """Say on stderr which of the dataset's input lines are skipped as too long."""
        _, too_long = dataset.filter_indices_by_size(np.arange(len(dataset)), max_positions)
        for index in too_long:
            line = dataset.input_lines[index]
            print(f"fairseq-interactive: input line {self.lines_before + index + 1} skipped: "
                  f"{dataset.size(index)[0]} tokens, more than the model takes ({max_positions}): "
                  f"{line[:60]!r}{'...' if len(line) > 60 else ''}", file=sys.stderr)

    def collated_text(self, sample):
        """The source lines of a batch. fairseq-interactive passes inference_step only the
        batch's tensors, and translates its batches in the order they are collated, which is
        when their text was recorded."""
        if not self.collated:
            raise RuntimeError("unknown-word replacement: no source text was recorded for this "
                               "batch (only fairseq-generate's and fairseq-interactive's "
                               "batches carry it)")
        batch = self.collated.popleft()
        if not torch.equal(batch["net_input"]["src_tokens"], sample["net_input"]["src_tokens"].cpu()):
            raise RuntimeError("unknown-word replacement: the batch being translated is not the "
                               "one collated next; its source text is unknown")
        return batch["src_text"]
