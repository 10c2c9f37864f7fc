"""fairseq's beam search (``SequenceGenerator._generate`` with ``search.BeamSearch``) over an
exported model's step, in torch alone.

The same algorithm as fairseq's, step for step, as the plugin runs it (its lean beam step):
each hypothesis offers the special symbols and its 2 x beam best words; the sentence's
2 x beam best continuations are taken by score; those ending in eos among the first beam of
them are finished (the score divided by length ** lenpen); the beam best others go on. A
sentence is done when it has beam finished hypotheses or reaches the longest output
allowed, and leaves the batch. Hypotheses come back best first, as fairseq's. With
vocabulary selection a hypothesis's words are its sentence's candidates
(:mod:`.output_layer`), as the lean step's over the plugin's candidates. The bookkeeping of a
step around the model is :mod:`.search_step`'s, in two calls of a C++ kernel.
"""
from dataclasses import dataclass
from typing import List

import torch

from . import search_step, top_log_probs

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


@torch.inference_mode()
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
    cand_size = CANDIDATE_MULTIPLE * beam

    tokens = torch.full((bsz * beam, max_len + 2), pad, dtype=torch.long)
    tokens[:, 0] = eos
    scores = torch.zeros(bsz * beam, max_len + 1)
    windows = [torch.zeros(bsz, 1, k, channels) for k, channels in model.windows]
    cands_to_ignore = torch.zeros(bsz, beam, dtype=torch.bool)
    finalized: List[List[Hypothesis]] = [[] for _ in range(bsz)]
    finished = [False] * bsz
    sentence_of = torch.arange(bsz)  # each row of the batch's sentence
    masks = (nspecial, eos, pad, unk, options.unkpen, max_len, options.min_len, cand_size)

    for step in range(max_len + 1):
        # the first step once per sentence: its hypotheses all hold eos alone
        last = tokens[::beam, step: step + 1] if step == 0 else tokens[:, step].view(bsz, beam)
        features, windows = model.step(last, step, windows, z, sources)
        if step == 0:
            windows = [w.expand(-1, beam, -1, -1) for w in windows]
        features = features.reshape(-1, features.size(-1))
        lprobs, columns = _local_log_probs(output.logits(features), nspecial, words_per_row, output.not_words)
        found = search_step.candidates(lprobs, columns, output.column_ids, scores, cands_to_ignore, step, bsz, beam,
                                       *masks)
        finalized_rows: List[int] = []
        if found.any_end:
            ends = found.ends[:, :beam]
            rows = torch.masked_select(found.beams[:, :beam] + torch.arange(bsz).unsqueeze(1) * beam, mask=ends)
            finalized_rows = _finalize(step, rows, torch.masked_select(found.scores[:, :beam], mask=ends), tokens,
                                       scores, finalized, finished, sentence_of, eos, beam, max_len, options.lenpen)
        if all(finished):
            break

        if finalized_rows:  # the finished sentences leave the batch
            keep = torch.ones(bsz, dtype=torch.bool)
            keep[finalized_rows] = False
            batch_idxs = keep.nonzero().squeeze(1)
            bsz = len(batch_idxs)
            found = search_step.Candidates(*(t[batch_idxs] for t in found[:4]), found.any_end)
            cands_to_ignore, sentence_of = cands_to_ignore[batch_idxs], sentence_of[batch_idxs]
            scores = scores.view(-1, beam, scores.size(1))[batch_idxs].view(bsz * beam, -1)
            tokens = tokens.view(-1, beam, tokens.size(1))[batch_idxs].view(bsz * beam, -1)
            windows = [w[batch_idxs] for w in windows]
            output.keep(batch_idxs)
            z, sources = z[batch_idxs], [s[batch_idxs] for s in sources]

        # the beam best candidates that do not end become the hypotheses
        cands_to_ignore, windows = search_step.advance(found, cands_to_ignore, tokens, scores, windows, step, beam)

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
