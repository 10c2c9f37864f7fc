"""fairseq's beam search (``SequenceGenerator._generate`` with ``search.BeamSearch``) over an
exported model's step, in torch alone.

The same algorithm as fairseq's, step for step, as the plugin runs it (its lean beam step):
each hypothesis offers the special symbols and its 2 x beam best words; the sentence's
2 x beam best continuations are taken by score; those ending in eos among the first beam of
them are finished (the score divided by length ** lenpen); the beam best others go on. A
sentence is done when it has beam finished hypotheses or reaches the longest output
allowed, and leaves the batch. Hypotheses come back best first, as fairseq's. With
vocabulary selection a hypothesis's words are its sentence's candidates
(:mod:`.output_layer`), as the lean step's over the plugin's candidates.
"""
import math
from dataclasses import dataclass
from typing import List

import torch

from . import top_log_probs

CANDIDATE_MULTIPLE = 2  # fairseq's BeamSearch keeps 2 x beam candidates, half of them may end


@dataclass
class Hypothesis:
    """A finished hypothesis: its target ids (ending with eos), its score (the sum of its
    log-probabilities over length ** lenpen) and each position's log-probability."""
    tokens: torch.Tensor
    score: float
    positional_scores: torch.Tensor


@dataclass
class SearchOptions:
    """fairseq-generate's options of the same names."""
    beam: int = 5
    max_len_a: float = 0.0
    max_len_b: int = 200
    min_len: int = 1
    lenpen: float = 1.0
    unkpen: float = 0.0


def beam_search(model, src_tokens: torch.Tensor, options: SearchOptions) -> List[List[Hypothesis]]:
    """The hypotheses of each sentence of ``src_tokens`` (sentences x S, left-padded, each
    ending with eos, at least one word), best first; ``model`` an
    :class:`~convs2s_serving.translator.ExportedModel`."""
    beam, eos, pad, unk, nspecial = options.beam, model.eos, model.pad, model.unk, model.nspecial
    bsz, src_len = src_tokens.shape
    max_len = min(int(options.max_len_a * src_len + options.max_len_b), model.max_target_positions - 1)
    if options.min_len > max_len:
        raise ValueError(f"the shortest output ({options.min_len}) is longer than the longest ({max_len})")
    z, sources = model.encode(src_tokens)
    output = model.output_layer_for(src_tokens, beam)  # W_o over the batch's words
    words_per_row = min(CANDIDATE_MULTIPLE * beam, output.fewest_words - nspecial)
    width = nspecial + words_per_row
    cand_size = CANDIDATE_MULTIPLE * beam

    tokens = torch.full((bsz * beam, max_len + 2), pad, dtype=torch.long)
    tokens[:, 0] = eos
    scores = torch.zeros(bsz * beam, max_len + 1)
    windows = [torch.zeros(bsz, 1, k, channels) for k, channels in model.windows]
    cands_to_ignore = torch.zeros(bsz, beam, dtype=torch.bool)
    finalized: List[List[Hypothesis]] = [[] for _ in range(bsz)]
    finished = [False] * bsz
    sentence_of = torch.arange(bsz)  # each row of the batch's sentence
    bbsz_offsets = (torch.arange(bsz) * beam).unsqueeze(1)
    cand_offsets = torch.arange(cand_size)
    specials = torch.arange(nspecial)

    for step in range(max_len + 1):
        # the first step once per sentence: its hypotheses all hold eos alone
        last = tokens[::beam, step: step + 1] if step == 0 else tokens[:, step].view(bsz, beam)
        features, windows = model.step(last, step, windows, z, sources)
        if step == 0:
            windows = [w.expand(-1, beam, -1, -1) for w in windows]
        features = features.reshape(-1, features.size(-1))
        lprobs, best_words = _local_log_probs(output.logits(features), nspecial, words_per_row, output.not_words)
        words = torch.cat([specials.expand(lprobs.size(0), -1), output.words(best_words)], dim=1)
        lprobs[:, pad] = -math.inf
        lprobs[:, unk] -= options.unkpen
        if step >= max_len:
            lprobs[:, :eos] = -math.inf
            lprobs[:, eos + 1:] = -math.inf
        if step < options.min_len:
            lprobs[:, eos] = -math.inf

        # search.BeamSearch.step
        if step > 0:
            lprobs = (lprobs.view(bsz, beam, width) + scores[:, step - 1].view(bsz, beam, 1)).view(bsz, -1)
        top = torch.topk(lprobs, k=min(cand_size, lprobs.size(1) - 1))
        cand_scores = top.values
        cand_beams = torch.div(top.indices, width, rounding_mode="trunc")
        cand_indices = words.view(bsz, -1).gather(1, top.indices)

        cand_bbsz_idx = cand_beams + bbsz_offsets
        eos_mask = cand_indices.eq(eos) & cand_scores.ne(-math.inf)
        eos_mask[:, :beam][cands_to_ignore] = False
        eos_bbsz_idx = torch.masked_select(cand_bbsz_idx[:, :beam], mask=eos_mask[:, :beam])
        finalized_rows: List[int] = []
        if eos_bbsz_idx.numel() > 0:
            eos_scores = torch.masked_select(cand_scores[:, :beam], mask=eos_mask[:, :beam])
            finalized_rows = _finalize(step, eos_bbsz_idx, eos_scores, tokens, scores, finalized, finished,
                                       sentence_of, eos, beam, max_len, options.lenpen)
        if all(finished):
            break

        if finalized_rows:  # the finished sentences leave the batch
            keep = torch.ones(bsz, dtype=torch.bool)
            keep[finalized_rows] = False
            batch_idxs = keep.nonzero().squeeze(1)
            bsz = len(batch_idxs)
            eos_mask, cand_beams = eos_mask[batch_idxs], cand_beams[batch_idxs]
            bbsz_offsets = bbsz_offsets[:bsz]
            cand_bbsz_idx = cand_beams + bbsz_offsets
            cand_scores, cand_indices = cand_scores[batch_idxs], cand_indices[batch_idxs]
            cands_to_ignore, sentence_of = cands_to_ignore[batch_idxs], sentence_of[batch_idxs]
            scores = scores.view(-1, beam, scores.size(1))[batch_idxs].view(bsz * beam, -1)
            tokens = tokens.view(-1, beam, tokens.size(1))[batch_idxs].view(bsz * beam, -1)
            windows = [w[batch_idxs] for w in windows]
            output.keep(batch_idxs)
            z, sources = z[batch_idxs], [s[batch_idxs] for s in sources]

        # the beam best candidates that do not end, in the candidates' order
        eos_mask[:, :beam] = ~((~cands_to_ignore) & (~eos_mask[:, :beam]))
        active_mask = eos_mask.long() * cand_size + cand_offsets[: eos_mask.size(1)]
        new_cands_to_ignore, active_hypos = torch.topk(active_mask, k=beam, dim=1, largest=False)
        cands_to_ignore = new_cands_to_ignore.ge(cand_size)[:, :beam]
        active_bbsz_idx = torch.gather(cand_bbsz_idx, dim=1, index=active_hypos).view(-1)

        tokens[:, : step + 1] = tokens[:, : step + 1].index_select(0, active_bbsz_idx)
        tokens.view(bsz, beam, -1)[:, :, step + 1] = torch.gather(cand_indices, dim=1, index=active_hypos)
        if step > 0:
            scores[:, :step] = scores[:, :step].index_select(0, active_bbsz_idx)
        scores.view(bsz, beam, -1)[:, :, step] = torch.gather(cand_scores, dim=1, index=active_hypos)
        windows = [w.reshape(-1, *w.shape[2:]).index_select(0, active_bbsz_idx).view(bsz, beam, *w.shape[2:])
                   for w in windows]

    for hypotheses in finalized:  # best first, as fairseq sorts them
        order = torch.sort(torch.tensor([h.score for h in hypotheses]), descending=True).indices
        hypotheses[:] = [hypotheses[i] for i in order]
    return finalized


def _local_log_probs(logits, nspecial, words_per_row, not_words):
    """Each row's log-probabilities of the special symbols and of its best words (the lean
    step's local vocabulary), and those words' columns: one CPU kernel that reads each row
    once (:mod:`.top_log_probs`), or torch's log_softmax and top-k; the same numbers. The
    last ``not_words`` columns count in the softmax, never among the best words."""
    top = top_log_probs.log_softmax_top_k(logits, nspecial, words_per_row, not_words)
    if top is None:
        top = top_log_probs.top_k(torch.log_softmax(logits, dim=-1), nspecial, words_per_row, not_words)
    return top


def _finalize(step, bbsz_idx, eos_scores, tokens, scores, finalized, finished, sentence_of, eos, beam, max_len,
              lenpen):
    """fairseq's ``finalize_hypos``: the hypotheses ending at ``step`` kept (up to beam a
    sentence); returns the batch rows of the sentences that are now done."""
    tokens_clone = tokens.index_select(0, bbsz_idx)[:, 1: step + 2]
    tokens_clone[:, step] = eos
    pos_scores = scores.index_select(0, bbsz_idx)[:, : step + 1]
    pos_scores[:, step] = eos_scores
    pos_scores[:, 1:] = pos_scores[:, 1:] - pos_scores[:, :-1]
    eos_scores = eos_scores / (step + 1) ** lenpen
    rows = torch.div(bbsz_idx, beam, rounding_mode="trunc")
    sentences = sentence_of[rows].tolist()
    for i, sentence in enumerate(sentences):
        if len(finalized[sentence]) < beam:
            finalized[sentence].append(Hypothesis(tokens_clone[i], float(eos_scores[i]), pos_scores[i]))
    done = []
    for sentence, row in sorted(set(zip(sentences, rows.tolist()))):
        if not finished[sentence] and (len(finalized[sentence]) == beam or step == max_len):
            finished[sentence] = True
            done.append(row)
    return done
