"""W_o of an exported model in a beam search, a batch at a time: over the whole vocabulary, or
over each sentence's candidate words (vocabulary selection, ``convs2s-export
--vocab-selection``).

Both write a step's logits into memory kept for the batch (a step's fresh hypotheses x V
tensor cost the int8 product its first touch, :mod:`fairseq_convs2s_ext.generation.export`)
and give the search the target ids of its local columns (``column_ids``). Over candidates
they compute what the plugin's ``OutputProjection`` does with each sentence's own candidates,
product for product: the columns every sentence shares (the specials, the most common words,
the words many of the batch's sentences have, then a column per cluster of the words a
sentence's candidates leave out) with one product for every hypothesis, -inf where a sentence
lacks the word; each sentence's other words' rows gathered once a batch and multiplied by its
hypotheses alone; the finished sentences' rows dropped as they leave. In int8 the shared rows are W_o's int8
rows (and the clusters' rows quantized at export), those the plugin quantizes once a batch:
the same int8 values and scales.
"""
from typing import Optional

import torch

from . import int8_linear
from .candidates import candidates_per_sentence, rest_log_counts, shared_columns


class EveryWord:
    """W_o over the whole vocabulary: the local columns are the target ids."""

    not_words = 0  # columns of the logits that are not words
    column_ids = None  # the local columns are the target ids

    def __init__(self, layer: dict, hypotheses: int):
        self.product = _Product(layer)
        self.memory = torch.empty(hypotheses, len(layer["bias"]))  # every step's, in the same memory
        self.fewest_words = len(layer["bias"])  # of any sentence, the specials counted

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """W_o times ``features`` (rows x embedding) plus its bias: the plugin's ``addmm`` in
        float32 (``OutputProjection``), its int8 kernel for an int8 export."""
        return self.product(features, self.memory[: len(features)])

    def keep(self, sentences: torch.Tensor) -> None:
        pass


class SentenceCandidates:
    """W_o over each sentence's candidates (:func:`.candidates.candidates_per_sentence` of the
    exported ``selection``'s tables), a sentence's hypotheses being consecutive rows of the
    features. The logits of a row: the shared columns' words, the sentence's own words (-inf
    past its last), then the clusters' columns, which count in the softmax but are not words
    (:attr:`not_words`)."""

    def __init__(self, layer: dict, selection: dict, src_tokens: torch.Tensor):
        self.candidates = candidates_per_sentence(selection["aligned"], selection["always"], len(layer["bias"]),
                                                  src_tokens)
        self.fewest_words = int(self.candidates.ge(0).sum(1).min())
        ids, self.shared_words = shared_columns(self.candidates)
        shared = _rows(layer, ids)
        missing = self.candidates[:, : self.shared_words] < 0
        self.absent = torch.zeros(missing.shape).masked_fill_(missing, float("-inf")) if missing.any() else None
        own = self.candidates[:, self.shared_words:]
        rows = _rows(layer, own.clamp(min=0).reshape(-1))
        self.own = {name: t.view(*own.shape, *t.shape[1:]) for name, t in rows.items()}
        self.own["bias"] = self.own["bias"].masked_fill(own < 0, float("-inf"))
        self.rest: Optional[torch.Tensor] = None
        self.not_words = 0
        if "rest_rows" in selection:  # the clusters' rows after the words', in the same product
            clusters = selection["rest_rows"]
            self.not_words = len(clusters["bias"])
            self.rest = rest_log_counts(selection["rest_labels"], selection["rest_sizes"], self.candidates,
                                        torch.float32)
            shared = {name: torch.cat([t, clusters[name]]) for name, t in shared.items()}
        self.shared = {name: t.contiguous() for name, t in shared.items()}
        self.product = _Product(self.shared)
        self.memory = {}

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The logits of ``features`` (rows x embedding, a sentence's hypotheses consecutive)
        over the candidates of each row's sentence."""
        sentences, channels = len(self.candidates), features.size(1)
        logits = self.product(features, self._memory("shared", len(features), len(self.shared["bias"])))
        by_sentence = logits.view(sentences, -1, logits.size(-1))
        words = self.shared_words
        if self.absent is not None:  # -inf added: faster than a broadcast masked_fill_
            by_sentence[..., :words].add_(self.absent.unsqueeze(1))
        if self.rest is not None:
            by_sentence[..., words:].add_(self.rest.unsqueeze(1))
        if self.own["bias"].size(1) == 0:
            return logits
        hypotheses = features.view(sentences, -1, channels)
        if "weight_int8" in self.own:
            own = int8_linear.int8_rows_by_sentence(self.own["weight_int8"], self.own["weight_scale"],
                                                    self.own["bias"], hypotheses)
        else:  # each sentence's rows times its few hypotheses, as the plugin's own_product
            own = torch.baddbmm(self.own["bias"].unsqueeze(2), self.own["weight"],
                                hypotheses.transpose(1, 2)).transpose(1, 2)
        parts = [by_sentence[..., :words], own, by_sentence[..., words:]]
        columns = sum(part.size(-1) for part in parts)
        out = self._memory("logits", len(features), columns).view(sentences, -1, columns)
        return torch.cat(parts, dim=-1, out=out).view(len(features), columns)

    @property
    def column_ids(self) -> torch.Tensor:
        """The target id of each sentence's local columns (sentences x columns)."""
        return self.candidates

    def keep(self, sentences: torch.Tensor) -> None:
        """Only the ``sentences`` still searched (their positions in the batch as it was)."""
        self.candidates = self.candidates[sentences]
        self.own = {name: t[sentences] for name, t in self.own.items()}
        if self.absent is not None:
            self.absent = self.absent[sentences]
        if self.rest is not None:
            self.rest = self.rest[sentences]

    def _memory(self, name: str, rows: int, columns: int) -> torch.Tensor:
        """A rows x columns tensor kept for the batch, written over at every step, grown where
        a step needs more (the first step has a row a sentence)."""
        memory = self.memory.get(name)
        if memory is None or memory.numel() < rows * columns:
            memory = self.memory[name] = torch.empty(rows * columns)
        return memory[: rows * columns].view(rows, columns)


def _rows(layer: dict, ids: torch.Tensor) -> dict:
    """W_o's tensors (``output.pt``'s) of the words ``ids``."""
    return {name: t.index_select(0, ids) for name, t in layer.items()}


class _Product:
    """``features`` times a layer's rows (float32 ``weight``, or int8 ``weight_int8`` and
    ``weight_scale``) plus ``bias``, into ``out``; in int8 the product chosen once for each
    number of rows (:func:`.int8_linear.bound_product`)."""

    def __init__(self, layer: dict):
        self.layer, self.by_rows = layer, {}

    def __call__(self, features: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        if "weight_int8" not in layer:
            return torch.addmm(layer["bias"], features, layer["weight"].t(), out=out)
        product = self.by_rows.get(len(features))
        if product is None:
            product = self.by_rows[len(features)] = int8_linear.bound_product(
                len(features), layer["weight_int8"].t(), layer["weight_scale"], layer["bias"])
        return product(features, out)
