"""W_o, the decoder's output projection (section 3.2), over every word of the vocabulary or
over candidate words only (vocabulary selection, section 5's setup).

p(y_{i+1} | y_1..y_i, x) = softmax(W_o h_i^L + b_o). With vocabulary selection
(:mod:`fairseq_convs2s_ext.data.vocabulary_selection`) only the candidates' rows of W_o and
b_o are used: the batch's in training, each sentence's own in generation, where a beam search
gathers a sentence's rows once and keeps them as its sentences finish. What this module adds
to a linear layer is that: the candidates' rows (typed records :class:`BatchRows` and
:class:`SentenceRows` instead of dictionaries), the columns that stand for the words a
sentence's candidates leave out (:meth:`OutputProjection.estimate_rest`), the logits of every
word in one reused tensor (``reuse_logits``), and fc2 folded into W_o for generation.

fconv names this layer ``fc3`` (:data:`FCONV_NAME`): fconv's checkpoints import under the
decoder's name for it, and checkpoints saved with fconv's name load
(``ConvS2SDecoder.upgrade_state_dict_named``).
"""
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from convs2s_serving.candidates import cluster_sizes, rest_log_counts, shared_columns
from fairseq.incremental_decoding_utils import with_incremental_state
from torch.nn.utils import parametrize

from .beam_reordering import keep_rows_, sentences_kept

FCONV_NAME = "fc3"


class BatchRows(NamedTuple):
    """The rows of W_o and b_o of a batch's candidates (sorted target ids), scored for every
    hypothesis."""
    weight: torch.Tensor  # candidates x channels
    bias: torch.Tensor  # candidates


@dataclass
class SentenceRows:
    """The rows of W_o and b_o that each sentence's candidates read (candidates S x C, see
    :meth:`OutputProjection.forward`), a sentence's hypotheses being ``beam`` consecutive rows."""
    shared_weight: torch.Tensor  # the columns scored for every hypothesis: words, then rest clusters
    shared_bias: torch.Tensor
    shared_words: int  # how many of the shared columns are words
    absent: Optional[torch.Tensor]  # S x shared words: -inf where a sentence lacks the word; None: none does
    own_weight: torch.Tensor  # S x own words x channels: each sentence's other words
    own_bias: torch.Tensor  # S x own words, -inf where there is no word
    rest: Optional[torch.Tensor]  # S x clusters: log of how many of each cluster's words a sentence lacks
    beam: int
    own_scale: Optional[torch.Tensor] = None  # S x own words: own_weight's row scales where it is int8

    def keep_(self, sentences: torch.Tensor):
        """Only the ``sentences`` still searched: their own rows move down over those of the
        finished ones, in place, so that no second copy of them is made."""
        self.own_weight = keep_rows_(self.own_weight, sentences)
        self.own_bias = keep_rows_(self.own_bias, sentences)
        if self.own_scale is not None:
            self.own_scale = keep_rows_(self.own_scale, sentences)
        if self.absent is not None:
            self.absent = self.absent.index_select(0, sentences)
        if self.rest is not None:
            self.rest = self.rest.index_select(0, sentences)


class RestClusters(NamedTuple):
    """A cluster id for each word of the vocabulary (-1: a word every sentence has), and how
    many words each cluster holds."""
    labels: torch.Tensor
    sizes: torch.Tensor

    @property
    def count(self) -> int:
        return len(self.sizes)


@with_incremental_state
class OutputProjection(nn.Linear):
    """W_o h + b_o: logits of every word, or of candidate words only."""

    def __init__(self, in_features: int, vocabulary_size: int):
        super().__init__(in_features, vocabulary_size)
        self.rest_clusters: Optional[RestClusters] = None  # see estimate_rest

    def forward(self, features, candidates=None, incremental_state=None, reuse_logits=False):
        """Logits of every word, or of the ``candidates`` only (only their rows of W_o and
        b_o are used). ``candidates`` are the sorted ids of the batch's words (1-D), or each
        sentence's words (S x C, padded with negative ids, whose logits are -inf), the
        hypotheses of a sentence being consecutive rows of ``features``. The leading columns
        that hold one word in every row (or none: a negative id) are scored for every
        hypothesis with one matrix multiply, as the batch's words are, and are -inf in the
        rows of the sentences without them (``VocabularySelection.candidates_per_sentence``
        puts the specials, the most common words and the words many sentences share there).
        Each sentence's other words' rows are gathered into a sentence x word x channel
        tensor, multiplied by its hypotheses alone. In a beam search the gathered rows are
        kept in the incremental state, gathered once for the batch and compacted in place as
        sentences finish (:meth:`reorder_incremental_state`). After :meth:`estimate_rest`,
        each sentence's logits end with a column per cluster of the words outside its
        candidates, which count in the softmax's normaliser but are not words.

        ``reuse_logits`` (for a caller done with a step's logits before the next step, as the
        lean beam step is): the whole vocabulary's logits are written into one tensor kept in
        the incremental state, overwritten at every step, instead of a new hypotheses x V
        tensor each step, fresh memory from the system whose first touch costs time of its
        own (bench/README.md as of 86165d7~, "What each lever bought"); with candidates, so are
        their logits and the product of the shared columns (:meth:`step_logits`). The values
        are ``F.linear``'s (this ``addmm``). Features in another dtype than the layer's (under
        autocast) go through ``F.linear``, which casts. (The dtype is read from b_o: W_o, when
        weight normalized, is recomputed at each read.)"""
        if candidates is None:
            return self.every_word(features, incremental_state, reuse_logits)
        rows = self.get_incremental_state(incremental_state, "candidate_rows")
        if rows is None:
            rows = self.gather_rows(candidates, features.size(0), incremental_state)
        if isinstance(rows, BatchRows):
            out = self.step_logits(features, incremental_state, reuse_logits, "logits", len(rows.bias))
            return self.rows_product(features, rows.weight, rows.bias, incremental_state, out)
        out = self.step_logits(features, incremental_state, reuse_logits, "shared_logits", len(rows.shared_bias))
        logits = self.rows_product(features, rows.shared_weight, rows.shared_bias, incremental_state, out)
        hypotheses, steps, channels = features.shape
        sentences = rows.own_weight.size(0)
        by_sentence_logits = logits.view(sentences, -1, logits.size(-1))
        words = rows.shared_words  # the shared columns that are words; then the rest's
        if rows.absent is not None:  # -inf added: faster than a broadcast masked_fill_
            by_sentence_logits[..., :words].add_(rows.absent.unsqueeze(1))
        if rows.rest is not None:
            by_sentence_logits[..., words:].add_(rows.rest.unsqueeze(1))
        if rows.own_weight.size(1) == 0:
            return logits
        own = self.own_product(rows, features.reshape(sentences, -1, channels))
        parts = [by_sentence_logits[..., :words], own, by_sentence_logits[..., words:]]
        columns = sum(part.size(-1) for part in parts)
        out = self.step_logits(features, incremental_state, reuse_logits, "logits", columns)
        out = None if out is None else out.view(sentences, -1, columns)
        return torch.cat(parts, dim=-1, out=out).view(hypotheses, steps, -1)

    def own_product(self, rows: "SentenceRows", by_sentence: torch.Tensor) -> torch.Tensor:
        """The logits of each sentence's own words: sentences x hypotheses x own words, from
        ``by_sentence`` (sentences x hypotheses x channels)."""
        # each sentence's rows times its few hypotheses (words x hypotheses), faster than the
        # hypotheses times the rows' transpose (bench/README.md as of 86165d7~, "What each lever bought")
        return torch.baddbmm(rows.own_bias.unsqueeze(2), rows.own_weight, by_sentence.transpose(1, 2)).transpose(1, 2)

    def rows_product(self, features, weight, bias, incremental_state, out=None):
        """``features`` times gathered rows of W_o (``weight``, ``bias``: the batch's
        candidates, or the columns shared by every sentence), as a linear layer; into ``out``
        (positions x rows, :meth:`step_logits`) if given."""
        if out is None:
            return F.linear(features, weight, bias)
        torch.addmm(bias, features.reshape(len(out), -1), weight.t(), out=out)
        return out.view(*features.shape[:2], -1)

    def every_word(self, features, incremental_state, reuse_logits):
        """The logits of the whole vocabulary (see :meth:`forward` for ``reuse_logits``)."""
        logits = self.step_logits(features, incremental_state, reuse_logits, "logits", self.out_features)
        if logits is None:
            return super().forward(features)
        torch.addmm(self.bias, features.reshape(len(logits), -1), self.weight.t(), out=logits)
        return logits.view(*features.shape[:2], -1)

    def step_logits(self, features, incremental_state, reuse_logits: bool, name: str,
                    columns: int) -> Optional[torch.Tensor]:
        """A tensor for a step's logits (a row a position of ``features``, ``columns``
        columns), kept in the incremental state under ``name`` and written over at every step
        (``reuse_logits``); grown where a step needs more, as a batch's first steps do (the
        first has a row a sentence). None where a step's logits are new tensors: without
        ``reuse_logits`` or an incremental state, or for features in another dtype."""
        if not reuse_logits or incremental_state is None or features.dtype != self.bias.dtype:
            return None
        rows = features.size(0) * features.size(1)
        memory = self.get_incremental_state(incremental_state, name)
        if memory is None or memory.numel() < rows * columns:
            memory = self.bias.new_empty(rows * columns)
            self.set_incremental_state(incremental_state, name, memory)
        return memory[: rows * columns].view(rows, columns)

    def gather_rows(self, candidates, hypotheses: int, incremental_state=None):
        """The rows of W_o and b_o that :meth:`forward` reads for ``candidates`` and
        ``hypotheses`` rows of features, kept in ``incremental_state`` if given (the decoder
        gathers them ahead of a first step computed for fewer rows). For each sentence's
        candidates, the rows of the shared columns are W_o's rows of their words (b_o is
        -inf where there is no word), followed after :meth:`estimate_rest` by those of the
        clusters (:meth:`rest_rows`)."""
        if candidates.dim() == 1:
            rows = BatchRows(self.weight.index_select(0, candidates), self.bias.index_select(0, candidates))
        else:
            rows = self._sentence_rows(candidates, hypotheses)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "candidate_rows", rows)
        return rows

    def _sentence_rows(self, candidates, hypotheses):
        ids, width = shared_columns(candidates)
        shared_weight, shared_bias = self.weight.index_select(0, ids), self.bias.index_select(0, ids)
        missing = candidates[:, :width] < 0
        absent = None
        if missing.any():
            absent = torch.zeros_like(missing, dtype=shared_bias.dtype).masked_fill_(missing, float("-inf"))
        own = candidates[:, width:]
        words = own.clamp(min=0).reshape(-1)  # index_select copies whole rows: faster than indexing
        own_weight, own_scale = self.own_rows(words)
        own_weight = own_weight.view(*own.shape, own_weight.size(-1))
        own_scale = None if own_scale is None else own_scale.view_as(own)
        own_bias = self.bias.index_select(0, words).view_as(own).masked_fill(own < 0, float("-inf"))
        rest = None
        if self.rest_clusters is not None:  # its rows after the words', in the same product
            rest_weight, rest_bias, rest = self.rest_rows(candidates)
            shared_weight, shared_bias = torch.cat([shared_weight, rest_weight]), torch.cat([shared_bias, rest_bias])
        return SentenceRows(shared_weight, shared_bias, width, absent, own_weight, own_bias, rest,
                            beam=hypotheses // len(candidates), own_scale=own_scale)

    def own_rows(self, words: torch.Tensor):
        """W_o's rows of ``words`` (a sentence's own candidates, for :meth:`own_product`) and
        their scales where the rows are not the weights themselves (None here)."""
        return self.weight.index_select(0, words), None

    def reorder_incremental_state(self, incremental_state, new_order):
        """Keep the gathered rows of the sentences still searched (:meth:`SentenceRows.keep_`);
        a batch's rows are the same for every hypothesis."""
        rows = self.get_incremental_state(incremental_state, "candidate_rows")
        if isinstance(rows, SentenceRows):
            sentences = sentences_kept(new_order, rows.beam, len(rows.own_bias))
            if sentences is not None:
                rows.keep_(sentences)

    def estimate_rest(self, every_sentence: torch.Tensor, clusters: int, seed: int = 0):
        """Generation with each sentence's candidates: :meth:`forward` adds, after the
        candidates' logits, one column per cluster of the words outside ``every_sentence``
        (the ids that every sentence's candidates hold), which stands for the cluster's words
        that are not the sentence's candidates, so that the softmax's normaliser counts them;
        ``clusters`` 0: the candidates alone, as fairseq-lua.

        The clusters are k-means (scikit-learn's) of the rows [W_o | b_o] into ``clusters``
        clusters, or each word its own where there are no more words than that. A cluster c
        of n_c words, m_c of them a sentence's candidates, then stands for the mass of its
        others in the softmax's normaliser with one logit,
        log(n_c - m_c) + mean_{w in c}(W_o)_w h + mean_{w in c}(b_o)_w,
        the log of n_c - m_c times the exponential of the members' mean logit. For all n_c
        members (m_c = 0) it is a lower bound of their log-sum-exp (Jensen's inequality), and
        for a cluster of one word it is that word's logit: with every word its own cluster
        the normaliser is the full vocabulary's."""
        self.rest_clusters = None
        if clusters == 0:
            return
        labels = torch.full((self.out_features,), -1, dtype=torch.long)
        rest = torch.ones(self.out_features, dtype=torch.bool)
        rest[every_sentence.cpu()] = False
        words = int(rest.sum())
        if words <= clusters:
            labels[rest] = torch.arange(words)
        else:
            from sklearn.cluster import KMeans

            rows = torch.cat([self.weight[rest], self.bias[rest, None]], dim=1).detach().float().cpu().numpy()
            labels[rest] = torch.from_numpy(KMeans(clusters, n_init=1, random_state=seed).fit(rows).labels_).long()
        count = int(labels.max()) + 1
        self.rest_clusters = RestClusters(labels, cluster_sizes(labels, count)) if count > 0 else None

    def rest_columns(self, candidates) -> int:
        """How many columns after the words' the logits over ``candidates`` have (see
        :meth:`estimate_rest`)."""
        if self.rest_clusters is None or candidates is None or candidates.dim() != 2:
            return 0
        return self.rest_clusters.count

    def rest_rows(self, candidates):
        """The rows of the columns that stand for the words outside each sentence's
        ``candidates`` (see :meth:`estimate_rest`): :meth:`rest_mean_rows`, and for each
        sentence the log of how many of the cluster's words it lacks (-inf where none)."""
        weight, bias = self.rest_mean_rows()
        clusters, sizes = self.rest_clusters
        return weight, bias, rest_log_counts(clusters, sizes, candidates, self.bias.dtype)

    def rest_mean_rows(self):
        """Each cluster's mean row of W_o and mean of b_o (see :meth:`estimate_rest`)."""
        # per batch, from W_o as it is: a generator built in training (--eval-bleu) sees it change
        clusters, sizes = self.rest_clusters
        count, clusters = len(sizes), clusters.to(self.bias.device)
        slot = torch.where(clusters >= 0, clusters, count)  # the words every sentence has: a slot left out
        size = sizes.to(self.bias.device, self.bias.dtype)
        weight = self.weight.new_zeros(count + 1, self.in_features).index_add_(0, slot, self.weight)
        bias = self.bias.new_zeros(count + 1).index_add_(0, slot, self.bias)
        return weight[:count] / size.clamp(min=1).unsqueeze(1), bias[:count] / size.clamp(min=1)

    def fold_(self, linear: nn.Linear):
        """``linear`` (the decoder's fc2, W_2 x + b_2) folded in, for generation:
        W_o (W_2 x + b_2) + b_o = (W_o W_2) x + (W_o b_2 + b_o), one product per step instead
        of two. On the model's device, in its dtype; W_o's weight normalization is folded too."""
        with torch.no_grad():
            weight = self.weight @ linear.weight
            bias = F.linear(linear.bias, self.weight, self.bias)
        if parametrize.is_parametrized(self, "weight"):
            parametrize.remove_parametrizations(self, "weight")
        self.weight, self.bias = nn.Parameter(weight), nn.Parameter(bias)
        self.in_features = linear.in_features
