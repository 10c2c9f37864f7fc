"""A beam step's bookkeeping around the model (fairseq's ``search.BeamSearch.step`` and the
reordering of ``SequenceGenerator._generate``), in two calls: :func:`candidates` (each
sentence's best continuations, their ids, beams and ends) and, once :mod:`.search` has
finalized those that end, :func:`advance` (the beam best that go on become the hypotheses).

As torch operations they are some sixty calls a step from Python, each a few microseconds on
a beam's few rows: at a sentence a batch, as long as the compiled decoder step itself. The
kernel in ``search_step.cpp`` does each in one call, with torch's own topk (ties fall as they
do in fairseq), the same numbers; it is compiled on first use (:mod:`.kernels`) and used only
after it has matched the torch operations below on random steps. Where it cannot be built,
loaded or matched, the torch operations do the work, with a warning that says why.
"""
import math
from typing import List, NamedTuple, Optional, Tuple

import torch

from .kernels import Kernel


class Candidates(NamedTuple):
    """Each sentence's best continuations (bsz x k): their scores, target ids, the beam each
    continues and whether it ends (eos, a finite score, not to be ignored); and whether any of
    the first beam of them ends."""
    scores: torch.Tensor
    ids: torch.Tensor
    beams: torch.Tensor
    ends: torch.Tensor
    any_end: bool


def candidates(lprobs: torch.Tensor, columns: torch.Tensor, words: Optional[torch.Tensor], scores: torch.Tensor,
               cands_to_ignore: torch.Tensor, step: int, bsz: int, beam: int, nspecial: int, eos: int, pad: int,
               unk: int, unkpen: float, max_len: int, min_len: int, cand_size: int) -> Candidates:
    """``lprobs`` (rows x width; changed in place): each hypothesis's log-probabilities at the
    special symbols, then at its best words, whose local ``columns`` (rows x width - nspecial)
    are the target ids ``words[sentence][column]`` (sentences x C), or ids themselves where
    ``words`` is None; a row a hypothesis, or a row a sentence at the first step. ``scores``
    (hypotheses x steps): each hypothesis's scores so far. fairseq's masks (pad; unk's
    penalty; eos alone at the last step, never before ``min_len``), then its BeamSearch.step:
    the sentence's ``cand_size`` best by score."""
    kernel = load() if lprobs.device.type == "cpu" and lprobs.dtype == torch.float32 else None
    if kernel is not None:
        words = None if words is None else words.contiguous()
        return Candidates(*kernel.candidates(lprobs.contiguous(), columns.contiguous(), words, scores,
                                             cands_to_ignore.contiguous(), step, bsz, beam, nspecial, eos, pad,
                                             unk, unkpen, max_len, min_len, cand_size))
    return candidates_torch(lprobs, columns, words, scores, cands_to_ignore, step, bsz, beam, nspecial, eos, pad,
                            unk, unkpen, max_len, min_len, cand_size)


def advance(found: Candidates, cands_to_ignore: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor,
            windows: List[torch.Tensor], step: int, beam: int) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """The beam best candidates of each sentence that do not end (in the candidates' order;
    those that end after them, where fewer go on) become its hypotheses: ``tokens``
    (hypotheses x positions) and ``scores`` (hypotheses x steps) reordered up to ``step`` and
    extended, in place; the windows (bsz x beam x ...) reordered. Returns the next
    cands_to_ignore (the chosen that end) and the windows."""
    kernel = load() if tokens.device.type == "cpu" else None
    if kernel is not None and tokens.is_contiguous() and scores.is_contiguous():
        return kernel.advance(found.ends.contiguous(), cands_to_ignore.contiguous(), found.beams.contiguous(),
                              found.ids.contiguous(), found.scores.contiguous(), tokens, scores, windows, step,
                              beam)
    return advance_torch(found, cands_to_ignore, tokens, scores, windows, step, beam)


def candidates_torch(lprobs, columns, words, scores, cands_to_ignore, step, bsz, beam, nspecial, eos, pad, unk,
                     unkpen, max_len, min_len, cand_size) -> Candidates:
    """:func:`candidates` in torch operations: fairseq's own, as its lean step runs them."""
    width = lprobs.size(1)
    ids = columns if words is None else words.gather(1, columns.view(len(words), -1)).view_as(columns)
    specials = torch.arange(nspecial, device=lprobs.device)
    ids = torch.cat([specials.expand(lprobs.size(0), -1), ids], dim=1)
    lprobs[:, pad] = -math.inf
    lprobs[:, unk] -= unkpen
    if step >= max_len:
        lprobs[:, :eos] = -math.inf
        lprobs[:, eos + 1:] = -math.inf
    if step < min_len:
        lprobs[:, eos] = -math.inf
    if step > 0:
        lprobs = (lprobs.view(bsz, beam, width) + scores[:, step - 1].view(bsz, beam, 1)).view(bsz, -1)
    top = torch.topk(lprobs.view(bsz, -1), k=min(cand_size, lprobs.view(bsz, -1).size(1) - 1))
    cand_beams = torch.div(top.indices, width, rounding_mode="trunc")
    cand_ids = ids.view(bsz, -1).gather(1, top.indices)
    ends = cand_ids.eq(eos) & top.values.ne(-math.inf)
    ends[:, :beam][cands_to_ignore] = False
    return Candidates(top.values, cand_ids, cand_beams, ends, bool(ends[:, :beam].any()))


def advance_torch(found, cands_to_ignore, tokens, scores, windows, step, beam):
    """:func:`advance` in torch operations: fairseq's own."""
    bsz, k = found.ends.shape
    stops = found.ends.clone()
    stops[:, :beam] |= cands_to_ignore
    active_mask = stops.long() * k + torch.arange(k, device=stops.device)
    chosen_stop, active_hypos = torch.topk(active_mask, k=beam, dim=1, largest=False)
    active_bbsz_idx = (torch.gather(found.beams, dim=1, index=active_hypos)
                       + torch.arange(bsz, device=stops.device).unsqueeze(1) * beam).view(-1)
    tokens[:, : step + 1] = tokens[:, : step + 1].index_select(0, active_bbsz_idx)
    tokens.view(bsz, beam, -1)[:, :, step + 1] = torch.gather(found.ids, dim=1, index=active_hypos)
    if step > 0:
        scores[:, :step] = scores[:, :step].index_select(0, active_bbsz_idx)
    scores.view(bsz, beam, -1)[:, :, step] = torch.gather(found.scores, dim=1, index=active_hypos)
    windows = [w.reshape(-1, *w.shape[2:]).index_select(0, active_bbsz_idx).view(bsz, beam, *w.shape[2:])
               for w in windows]
    return chosen_stop.ge(k), windows


def load():
    """The compiled kernel, built on the first call of a process if need be; None where it
    cannot be had (the reason is logged once)."""
    return KERNEL.load()


def _mismatch(kernel) -> Optional[str]:
    """The first random step on which the kernel differs from the torch operations, if any:
    the first step (a row a sentence), steps before ``min_len`` and at the last, candidates
    that were to be ignored, an unk penalty, words through a sentence's candidates or not,
    ties (log-probabilities of few values) and -inf."""
    generator = torch.Generator().manual_seed(0)
    nspecial, eos, pad, unk, max_len = 4, 2, 1, 3, 6
    for case, (bsz, beam, words_per_row, step, min_len, unkpen, selection) in enumerate([
            (3, 5, 10, 0, 1, 0.0, False), (2, 5, 10, 2, 3, 0.5, True), (4, 4, 8, 4, 1, 0.0, False),
            (1, 5, 10, 6, 1, 0.0, True), (3, 2, 4, 3, 1, 0.0, True), (2, 1, 2, 5, 1, 1.0, False)]):
        rows, cand_size = (bsz if step == 0 else bsz * beam), 2 * beam
        lprobs = -torch.randint(0, 6, (rows, nspecial + words_per_row), generator=generator).float() / 2
        lprobs[0, -1] = -math.inf
        words = torch.randint(nspecial, 50, (bsz, 3 * words_per_row), generator=generator) if selection else None
        width = words.size(1) if selection else 50
        columns = torch.randint(0, width, (rows, words_per_row), generator=generator)
        if not selection:
            columns[0, 0] = eos  # an id of the whole vocabulary that ends
        scores = -torch.rand(bsz * beam, max_len + 1, generator=generator) * 4
        ignore = torch.rand(bsz, beam, generator=generator) < 0.3
        tokens = torch.randint(0, 50, (bsz * beam, max_len + 2), generator=generator)
        windows = [torch.randn(bsz, 1 if step == 0 else beam, 3, 4, generator=generator)]
        windows = [w.expand(-1, beam, -1, -1) for w in windows]
        args = (step, bsz, beam, nspecial, eos, pad, unk, unkpen, max_len, min_len, cand_size)
        found = Candidates(*kernel.candidates(lprobs.clone(), columns, words, scores, ignore, *args))
        expected = candidates_torch(lprobs.clone(), columns, words, scores, ignore, *args)
        if not (all(torch.equal(a, b) for a, b in zip(found[:4], expected[:4])) and found.any_end == expected.any_end):
            return f"step case {case}, candidates"
        kept = [tokens.clone(), scores.clone()]
        ignored, moved = kernel.advance(found.ends, ignore, found.beams, found.ids, found.scores, *kept, windows,
                                        step, beam)
        torch_kept = [tokens.clone(), scores.clone()]
        torch_ignored, torch_moved = advance_torch(expected, ignore, *torch_kept, windows, step, beam)
        if not (torch.equal(ignored, torch_ignored) and all(map(torch.equal, kept, torch_kept))
                and all(map(torch.equal, moved, torch_moved))):
            return f"step case {case}, advance"
    return None


KERNEL = Kernel("search_step", _mismatch, "torch's operations do its work, more slowly")
