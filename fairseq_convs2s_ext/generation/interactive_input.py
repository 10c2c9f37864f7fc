"""fairseq-interactive's input lines, as the task's hooks see them.

fairseq-interactive reads its input in buffers of lines, encodes them
(``get_interactive_tokens_and_lengths``), builds a dataset of their ids
(``build_dataset_for_inference``) and translates its batches (``inference_step``), passing
each hook only what fairseq needs. :class:`InteractiveInput` keeps what the hooks between
them do not pass on:

- each buffer's lines, so that an input line longer than the model takes is reported on
  stderr with its number and skipped, and the lines after it are translated (fairseq would
  stop at it with a traceback);
- how many input lines were not UTF-8: fairseq-interactive reads stdin as Python does under a
  UTF-8 locale, each byte that is not UTF-8 a lone surrogate, which makes its word ``<unk>``
  without a word said; they are counted, and the count is said in one line on stderr as
  the command ends (a file given with ``--input`` that is not UTF-8 stops fairseq with an
  error, reported by the excepthook);
- with unknown-word replacement, the encoded text of each batch as it is collated, which
  reaches the replacement instead of the ids fairseq rebuilds its source string from (where
  every unknown word reads ``<unk>``; its S- lines still do).
"""
import atexit
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
        self.not_utf8 = []  # (line number, first byte not UTF-8) of each such input line

    def read(self, lines, encode_fn, tokens_and_lengths):
        """The tokens and lengths of a buffer of input ``lines``, encoded by ``encode_fn``
        (``--tokenizer``, ``--bpe``) and turned into ids by ``tokens_and_lengths``; the
        buffer's lines are kept."""
        if self.buffer is not None:
            self.lines_before += len(self.buffer[2])
        self._count_not_utf8(lines)
        encoded = [encode_fn(line) for line in lines]
        tokens, lengths = tokens_and_lengths(encoded, lambda line: line)
        self.buffer = (tokens, encoded, list(lines))
        return tokens, lengths

    def _count_not_utf8(self, lines):
        """Record the lines holding a byte that was not UTF-8; the first has the count said at exit."""
        for index, line in enumerate(lines):
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate: a byte of stdin that was not UTF-8
                if not self.not_utf8:
                    atexit.register(self.report_not_utf8)
                self.not_utf8.append((self.lines_before + index + 1, ord(line[e.start]) - 0xDC00))

    def report_not_utf8(self):
        """Say on stderr how many input lines were not UTF-8, and what to do."""
        (first, byte), count = self.not_utf8[0], len(self.not_utf8)
        print(f"fairseq-interactive: warning: {count} input line{'s were' if count > 1 else ' was'} not UTF-8 "
              f"(the first: line {first}, byte {byte:#04x}): their words outside UTF-8 were read as <unk>; give "
              f"UTF-8 input, e.g. convert it with iconv -f ISO-8859-1 -t UTF-8 (from its real encoding)",
              file=sys.stderr)

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
