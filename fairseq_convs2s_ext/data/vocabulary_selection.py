"""Vocabulary selection: each batch scores only its candidate target words.

Gehring et al. (2017), section 5 setup, after fairseq-lua (``-aligndictpath -nmostcommon
-topnalign``): a word-level model with a large target vocabulary computes its output layer
(the rows of W_o and b_o) and its softmax only over the candidates of the batch:

- the special symbols (bos, pad, eos, unk, ...);
- the ``most_common`` most frequent target words, by how often the training data's
  target side has them aligned (the candidates file's counts). fairseq-lua took them in
  dictionary order: nearly the same for a dictionary of the target language alone, not for
  one shared by both languages (``--joined-dictionary``, BPE), which is ordered by both
  sides' counts (bench/README.md as of 86165d7~, the run of b835259);
- for each distinct source word of the batch, its ``top_aligned`` target words most often
  aligned to it in the training data (``convs2s-align-dict --candidates``);
- in training (and validation) only, every gold target word of the batch, so that no target
  is lost to the selection.

Training takes the candidates of the whole batch, as fairseq-lua did. Generation takes each
sentence's own (fairseq-lua's generate-lines translated a sentence at a time): a sentence has
far fewer candidates than its batch, so the output layer does a fraction of the work (the
words many sentences share are scored for every hypothesis, see
:meth:`VocabularySelection.candidates_per_sentence`; bench/README.md as of 86165d7~, "How far the
arithmetic lets selection go"), and the words a translation can use do not depend on the
other sentences of its batch (its scores only up to rounding).

The candidates of a batch are a sorted tensor of target dictionary ids, so the special
symbols come first at their own ids (0..nspecial-1) and local index i stands for word
``candidates[i]``; a set holding every word is the full vocabulary in its own order. Those
of each sentence are a row each (:meth:`VocabularySelection.candidates_per_sentence`): the
words that the output layer scores for every hypothesis first, in one column of every row
(the specials still at their own ids), then the sentence's others, padded with ``NO_WORD``
(:mod:`convs2s_serving.candidates`, the rule in torch alone, which an exported model applies too).

In generation the softmax's normaliser also counts the probability mass of the words left
out, estimated from clusters of the output layer's rows
(``OutputProjection.estimate_rest`` in :mod:`fairseq_convs2s_ext.modules.output_projection`,
over the words outside :attr:`VocabularySelection.always`), so that a hypothesis's scores
stay close to the full vocabulary's. fairseq-lua normalised over the candidates alone
(``--vocab-rest-clusters 0``). That raises every score by the mass left out, most at the
steps where the model is unsure, and so favours longer hypotheses through uncertain steps
(bench/README.md as of 86165d7~ measures the score deficit either way in the run of aa38a54).

The candidates file holds one line per source word, ``source target1 count1 target2 count2
...``, targets ranked by count. Words outside the model's dictionaries are skipped, as
fairseq-lua skipped ``<unk>``: the dictionaries may be truncated (``--nwordssrc``), and
such a word is ``<unk>`` on both sides. A file that cannot be the one of these
dictionaries (malformed lines, or one that covers less than half of either dictionary:
another corpus, another tokenization or segmentation, the languages swapped) is an error
that names the file and a line.
"""
import os
from typing import Optional

import torch
from convs2s_serving.candidates import candidates_per_sentence

MIN_COVERAGE = 0.5  # of a dictionary's words, for a candidates file built on its training text
# Symbols that fairseq-preprocess adds to pad a dictionary's size (--padding-factor).
MADE_UP_WORD = "madeupword"


class CandidatesFileError(ValueError):
    """A candidates file that is malformed or does not fit the model's dictionaries."""


class SelectionOptionError(ValueError):
    """A vocabulary selection option out of its range."""


def dictionary_words(dictionary):
    """The ids and words of a dictionary's real words: no specials, no padding symbols."""
    return [(i, w) for i, w in enumerate(dictionary.symbols)
            if i >= dictionary.nspecial and not w.startswith(MADE_UP_WORD)]


def read_candidates(path: str, src_dict, tgt_dict, top_aligned: int):
    """The candidates file as a table: row s holds the target ids of source id s's
    ``top_aligned`` best aligned words that are in ``tgt_dict``, padded with ``pad``
    (a special symbol, a candidate anyway); int32, as wide as the longest row. And how often
    each target id is aligned, summed over all of the file's pairs."""
    if not os.path.isfile(path):
        what = "a folder, not a file" if os.path.isdir(path) else "no such file"
        raise CandidatesFileError(f"{path}: {what}; write it with convs2s-align-dict "
                                  f"--candidates {path} on the training text")
    rows = {}
    target_counts = [0] * len(tgt_dict)
    seen_sources, seen_targets = {}, set()
    first_unknown_source = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            source, pairs = fields[0], fields[1:]
            targets, counts = pairs[0::2], pairs[1::2]
            if len(targets) != len(counts) or not all(c.isdigit() and int(c) > 0 for c in counts):
                raise CandidatesFileError(
                    f"{path} line {number}: expected 'source target1 count1 target2 count2 ...' "
                    f"with positive integer counts (as convs2s-align-dict --candidates writes)")
            counts = [int(c) for c in counts]
            if any(a < b for a, b in zip(counts, counts[1:])):
                raise CandidatesFileError(f"{path} line {number}: the targets of {source!r} are "
                                          f"not ranked by decreasing count")
            if source in seen_sources:
                raise CandidatesFileError(f"{path} line {number}: source word {source!r} again "
                                          f"(first on line {seen_sources[source]})")
            seen_sources[source] = number
            ids = [tgt_dict.index(t) for t in targets]
            seen_targets.update(ids)
            for t, count in zip(ids, counts):
                target_counts[t] += count
            s = src_dict.index(source)
            if s == src_dict.unk():
                first_unknown_source = first_unknown_source or (number, source)
                continue
            rows[s] = [t for t in ids if t != tgt_dict.unk()][:top_aligned]
    _check_coverage(path, "source", src_dict, set(seen_sources), first_unknown_source)
    _check_coverage(path, "target", tgt_dict, {tgt_dict[t] for t in seen_targets}, None)
    width = max(map(len, rows.values()), default=0)
    aligned = torch.full((len(src_dict), width), tgt_dict.pad(), dtype=torch.int32)
    for s, targets in rows.items():
        aligned[s, : len(targets)] = torch.tensor(targets, dtype=torch.int32)
    return aligned, torch.tensor(target_counts)


def _check_coverage(path, side, dictionary, words_in_file, first_unknown):
    words = dictionary_words(dictionary)
    covered = sum(w in words_in_file for _, w in words)
    if words and covered < MIN_COVERAGE * len(words):
        example = (f"; e.g. line {first_unknown[0]}: {first_unknown[1]!r} is not in the {side} "
                   f"dictionary" if first_unknown else "")
        raise CandidatesFileError(
            f"{path} does not fit the model's {side} dictionary: it names only {covered} of its "
            f"{len(words)} words{example}. Build it with convs2s-align-dict --candidates from "
            f"the training text the dictionaries were built on (tokenized and segmented the "
            f"same way), source and target in the model's order")


class VocabularySelection:
    """The candidate rule of one model's dictionaries, from its candidates file."""

    def __init__(self, aligned: torch.Tensor, target_counts: torch.Tensor, nspecial: int, most_common: int):
        """``target_counts``: how often each target id is aligned in the training data; the
        ``most_common`` words with the highest counts (ties: the smaller id) are candidates."""
        self.aligned = aligned
        self.nspecial = nspecial
        self.vocab_size = len(target_counts)
        by_count = torch.sort(target_counts[nspecial:], descending=True, stable=True).indices + nspecial
        self.always = torch.cat([torch.arange(nspecial), by_count[:most_common].sort().values])  # every sentence's

    @classmethod
    def from_file(cls, path: str, src_dict, tgt_dict, most_common: int, top_aligned: int):
        if most_common < 0 or top_aligned < 0:
            raise SelectionOptionError(f"--vocab-most-common ({most_common}) and --vocab-top-aligned "
                                       f"({top_aligned}) must not be negative")
        return cls(*read_candidates(path, src_dict, tgt_dict, top_aligned), tgt_dict.nspecial, most_common)

    def _moved_to(self, device):
        """The table of aligned words and the ids of the words every sentence has, moved once
        to the device of the batches."""
        if self.aligned.device != device:
            self.aligned, self.always = self.aligned.to(device), self.always.to(device)
        return self.aligned, self.always

    def with_candidates(self, sample, training: bool):
        """The batch ``sample`` with its candidate target words (``sample["candidates"]``): in
        training and validation the batch's, its gold target words among them; in generation
        each sentence's own."""
        if not sample:  # fairseq's empty dummy batch
            return sample
        src_tokens = sample["net_input"]["src_tokens"]
        if training:
            candidates = self.candidates(src_tokens, sample.get("target"))
        else:
            candidates = self.candidates_per_sentence(src_tokens)
        return dict(sample, candidates=candidates)

    def candidates(self, src_tokens: torch.Tensor, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The sorted target ids of a batch's candidates; ``target`` (its gold target words,
        in training) adds them. On the device of ``src_tokens``."""
        aligned, always = self._moved_to(src_tokens.device)
        chosen = torch.zeros(self.vocab_size, dtype=torch.bool, device=src_tokens.device)
        chosen[always] = True
        chosen[aligned[src_tokens.unique()].view(-1)] = True
        if target is not None:
            chosen[target.reshape(-1)] = True
        return chosen.nonzero().squeeze(1)

    def candidates_per_sentence(self, src_tokens: torch.Tensor) -> torch.Tensor:
        """Each sentence's candidates (generation), a row each (B x C), as
        :func:`convs2s_serving.candidates.candidates_per_sentence` orders them: the words
        scored for every hypothesis first, each at the same column in every row (``NO_WORD``
        where a sentence lacks it), then each sentence's others."""
        aligned, always = self._moved_to(src_tokens.device)
        return candidates_per_sentence(aligned, always, self.vocab_size, src_tokens)


def local_indices(candidates: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The positions in ``candidates`` (sorted) of target ids ``tokens``, all of them candidates."""
    return torch.searchsorted(candidates, tokens)
