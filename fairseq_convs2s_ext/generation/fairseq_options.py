"""fairseq's own generation options that fail inside fairseq 0.12.3, for every model, made to
work with ``--task convs2s_translation`` through its hooks, or refused in one line.

- ``--diverse-beam-groups G``: fairseq's ``DiverseBeamSearch`` keeps the overlap between its
  groups a row per sentence, filled by the sentence's position in the batch at the first step
  and read afterwards by the sentence's id (``original_batch_idxs``, the sample's ``id``). Any
  batch whose ids are not below its size (every batch of a split but one) stops with an
  IndexError, and a batch whose ids are its positions in another order reads another
  sentence's row. :class:`DiverseBeamSearchBySentence` reads the row by position;
  ``build_generator`` puts it in fairseq's place (:func:`with_repaired_search`).
- ``--print-step`` (fairseq-generate): fairseq prints each hypothesis's ``steps``, which only
  its iterative refinement generator records; beam search and ``--score-reference`` fail with
  KeyError 'steps'. ``inference_step`` records them (:func:`with_decoding_steps`).
- ``--score-reference`` in fairseq-interactive: it scores a split's reference translations,
  and fairseq-interactive reads source sentences alone (fairseq fails with KeyError 'target'),
  so it is refused in one line naming fairseq-generate, which does it
  (:data:`SCORE_REFERENCE_INTERACTIVE`).
"""
import torch
from fairseq import search

SCORE_REFERENCE_INTERACTIVE = (
    "--score-reference scores the reference translations of a split, and fairseq-interactive reads "
    "source sentences alone: score them with fairseq-generate DATA --path CKPT --gen-subset SPLIT "
    "--score-reference")


class GenerationOptionError(ValueError):
    """A generation option that cannot work with the command given (reported in one line)."""


class DiverseBeamSearchBySentence(search.DiverseBeamSearch):
    """fairseq's diverse beam search with each sentence's overlap between groups read by its
    position in the batch at the first step, where fairseq wrote it (see the module)."""

    first_ids: torch.Tensor  # the batch's sentence ids at the first step, in its order

    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
        if original_batch_idxs is not None:
            if step == 0:
                self.first_ids = original_batch_idxs
            # ids (those of the sentences not finished) -> their positions at the first step
            original_batch_idxs = original_batch_idxs.unsqueeze(1).eq(self.first_ids.unsqueeze(0)).int().argmax(1)
        return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs)


def with_repaired_search(generator, tgt_dict):
    """``generator`` with fairseq's diverse beam search, if it has it, replaced by
    :class:`DiverseBeamSearchBySentence` with the same options, before it is used."""
    stock = getattr(generator, "search", None)
    if type(stock) is search.DiverseBeamSearch:
        generator.search = DiverseBeamSearchBySentence(
            tgt_dict, stock.num_groups, -stock.diversity_strength,  # fairseq stores it negated
            stock.diversity_discount, stock.candidate_multiple)
    return generator


def with_decoding_steps(hypos):
    """``hypos`` (n-best lists) with each hypothesis's ``steps``, which fairseq-generate's
    ``--print-step`` prints: the decoder steps that gave it, one a token, its end of sentence
    included (a value of fairseq's iterative refinement generator, its iterations, is kept)."""
    for nbest in hypos:
        for hypo in nbest:
            hypo.setdefault("steps", len(hypo["tokens"]))
    return hypos
