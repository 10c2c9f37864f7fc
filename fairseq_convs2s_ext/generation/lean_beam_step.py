"""The lean beam step: fairseq's beam search over each hypothesis's 2 x beam best words.

fairseq's SequenceGenerator scores every word of the vocabulary at every step: the model's
log-probabilities (hypotheses x V) get a NaN mask, the hypotheses' cumulative scores added,
and a top-k over beam x V per sentence, which picks the 2 x beam best continuations. Over a
vocabulary of ten thousand words that per-step work is a large share of beam-5 generation
(bench/README.md as of 86165d7~, "Where generation time goes, and its ceiling").

Only a word among the 2 x beam best of its own hypothesis can be among the 2 x beam best
continuations of a sentence: a word with 2 x beam better words in its row has as many
better continuations (same cumulative score, higher log-probability). So the search is
unchanged when each hypothesis offers only its local vocabulary: the special symbols (bos,
pad, eos, unk, ... at their own ids 0..nspecial-1, so that the generator's handling of pad,
eos, unk, minimum and maximum length by index stays right) followed by its 2 x beam best
other words. The model's log-probabilities are computed exactly as fairseq computes them
(log_softmax of the logits, averaged over an ensemble as fairseq does), so hypotheses,
scores, positional scores and n-best lists are the same as stock fairseq's, bit for bit
(up to the order of exactly tied scores, which torch's top-k leaves unspecified).
What stays per step over the whole vocabulary is the output projection, its log_softmax
(the log-sum-exp of a row needs the exp of every logit) and a top-k per row. On a CPU, for
one model, these two are one kernel (:mod:`convs2s_serving.top_log_probs`, which
``convs2s-serve`` uses too) that reads each row of logits once and writes only the
log-probabilities the search is offered, torch's values bit for bit; elsewhere (an
ensemble, a GPU, a CPU without the kernel) they are torch's log_softmax, in place over the
logits, and top-k. Gone are the NaN mask, the sum with the cumulative
scores, the temperature division at 1 and the two fresh hypotheses x V tensors of every
step (the logits live in one tensor, reused).

:class:`LeanSequenceGenerator` is a SequenceGenerator that does this: its model is a
:class:`LocalVocabularyEnsemble` (log-probabilities over the local vocabularies, whose global
ids it keeps) and its search a :class:`LocalVocabularyBeamSearch` (which maps the chosen local
columns back to global ids), both built with the generator. Everything else is fairseq's own
loop. Where the argument does not hold, the generator is fairseq's, unchanged: search
strategies other than plain beam search (sampling, diverse beam, constraints, prefix-allowed
tokens, ``--match-source-len``), ``--no-repeat-ngram-size``, a fused language model,
suppressed tokens, models other than ConvS2S; and calls with prefix tokens or constraints
are fairseq's own generator's.

Vocabulary selection (:mod:`fairseq_convs2s_ext.data.vocabulary_selection`) rides on the
same mechanism: the models score only the candidate words (the batch's, or each sentence's),
the best words of each row are chosen among them, and the table maps them back to full
dictionary ids. With a sentence's own candidates, the ensemble (and each decoder's W_o, for its
rows) drops the sentences that finish as fairseq reorders the hypotheses
(``reorder_incremental_state``), so that every sentence's rows are scored against its own words.
"""
import math
from typing import Optional

import torch
from convs2s_serving import top_log_probs
from convs2s_serving.search import CANDIDATE_MULTIPLE
from fairseq import search
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator, SequenceGeneratorWithAlignment

from ..modules.beam_reordering import sentences_kept


class LocalVocabularyEnsemble(EnsembleModel):
    """fairseq's ensemble whose ``forward_decoder`` returns each hypothesis's log-probabilities
    over its local vocabulary: the special symbols, then its ``words_per_row`` best words.

    With vocabulary selection, ``candidates`` (target ids, the specials first at their own
    ids: the batch's, or a row for each sentence) are the words the models score in the
    current call, and the best words are chosen among them.
    ``words`` holds, after each step, the global id of every local column (hypotheses x
    local width), for :class:`LocalVocabularyBeamSearch`. The logits' last ``not_words``
    columns are not words (the decoders' estimate of the words outside each sentence's
    candidates, ``OutputProjection.estimate_rest``): they count in the softmax, never among
    the best words.
    """

    def __init__(self, models, nspecial: int, beam_size: int):
        super().__init__(models)
        self.nspecial = nspecial
        self.beam_size = beam_size
        self.words_per_row = 0
        self.candidates: Optional[torch.Tensor] = None
        self.not_words = 0
        self.words: Optional[torch.Tensor] = None
        self.set_decoder_beam_size(beam_size)

    def select(self, candidates: Optional[torch.Tensor], vocabulary_size: int) -> int:
        """The candidates of the next call: None (every word of the ``vocabulary_size``), the
        batch's (1-D), or each sentence's (a row each, in the batch's order). Returns the
        width of the call's local vocabularies: the specials, then each row's 2 x beam best
        words (all of them, if the vocabulary or a sentence's candidates are fewer)."""
        if candidates is None:
            columns = vocabulary_size
        elif candidates.dim() == 1:
            columns = candidates.numel()
        else:  # the fewest words of a sentence
            columns = int(candidates.ge(0).sum(1).min())
        self.candidates = candidates
        not_words = {model.decoder.output_projection.rest_columns(candidates) for model in self.models}
        if len(not_words) != 1:
            raise ValueError("an ensemble's decoders estimate the words outside the candidates "
                             "with different numbers of clusters")
        self.not_words = not_words.pop()
        self.words_per_row = min(CANDIDATE_MULTIPLE * self.beam_size, columns - self.nspecial)
        return self.nspecial + self.words_per_row

    def reorder_incremental_state(self, incremental_states, new_order):
        super().reorder_incremental_state(incremental_states, new_order)
        if self.candidates is not None and self.candidates.dim() == 2:
            sentences = sentences_kept(new_order, self.beam_size, len(self.candidates))
            if sentences is not None:
                self.candidates = self.candidates[sentences]  # finished sentences left

    def forward_decoder(self, tokens, encoder_outs, incremental_states, temperature: float = 1.0):
        logits, extras = self.last_logits(tokens, encoder_outs, incremental_states, temperature)
        top = None
        if self.models_size == 1:  # on a CPU, one kernel that reads each row once
            top = top_log_probs.log_softmax_top_k(logits[0], self.nspecial, self.words_per_row, self.not_words)
        if top is None:
            top = top_log_probs.top_k(self.log_probs(logits, extras), self.nspecial, self.words_per_row,
                                      self.not_words)
        local, best_words = top
        if local.size(0) != tokens.size(0):  # a first step's row a sentence: its hypotheses' are copies
            copies = torch.arange(local.size(0), device=local.device).repeat_interleave(tokens.size(0) // local.size(0))
            local, best_words = local.index_select(0, copies), best_words.index_select(0, copies)
        if self.candidates is not None and self.candidates.dim() == 1:
            best_words = self.candidates[best_words]
        elif self.candidates is not None:  # each sentence's hypotheses among its own words
            best_words = self.candidates.gather(1, best_words.view(self.candidates.size(0), -1)).view_as(best_words)
        specials = torch.arange(self.nspecial, device=local.device).expand(local.size(0), -1)
        self.words = torch.cat([specials, best_words], dim=1)
        return local, self.average_attention(extras)

    def last_logits(self, tokens, encoder_outs, incremental_states, temperature: float):
        """Each model's logits of the last position (hypotheses x V, or x candidates), divided
        by the temperature unless it is 1, and its decoder's extra outputs. Each step's
        logits live in one tensor per model (W_o's ``reuse_logits``): no hypotheses x V
        tensor is allocated per step. A single model's first step gives a row a sentence
        (``first_step_logits_copied``): its log-probabilities and best words are taken once
        a sentence, then copied to its hypotheses (:meth:`forward_decoder`)."""
        logits, extras = [], []
        for model, encoder_out, state in zip(self.models, encoder_outs, incremental_states):
            step_logits, extra = model.decoder(tokens, encoder_out=encoder_out, incremental_state=state,
                                               candidates=self.candidates, reuse_logits=True,
                                               first_step_logits_copied=self.models_size > 1)
            step_logits = step_logits[:, -1, :]
            logits.append(step_logits.div_(temperature) if temperature != 1.0 else step_logits)
            extras.append(extra)
        return logits, extras

    def log_probs(self, logits, extras):
        """The log-probabilities of the last step, the values of fairseq's
        ``EnsembleModel.forward_decoder``: each model's log_softmax (in place of its logits),
        averaged in probability over an ensemble."""
        log_probs = []
        for model, step_logits, extra in zip(self.models, logits, extras):
            if step_logits.dtype == torch.float32:  # fairseq's log_softmax (utils.log_softmax), over the logits
                log_probs.append(torch.log_softmax(step_logits, dim=-1, out=step_logits))
            else:
                log_probs.append(model.get_normalized_probs((step_logits, extra), log_probs=True))
        if self.models_size == 1:
            return log_probs[0]
        return torch.logsumexp(torch.stack(log_probs, dim=0), dim=0) - math.log(self.models_size)

    def average_attention(self, extras):
        """The attention of the last step, averaged over an ensemble as fairseq does."""
        attention = [extra["attn"][0][:, -1, :] for extra in extras if extra["attn"][0] is not None]
        if not attention:
            return None
        average = attention[0]
        for attn in attention[1:]:
            average.add_(attn)
        return average.div_(self.models_size) if self.models_size > 1 else average


class LocalVocabularyBeamSearch(search.BeamSearch):
    """fairseq's beam search over local vocabularies: the chosen local columns are mapped
    back to global ids through the table the model kept for the step."""

    def __init__(self, tgt_dict, model: LocalVocabularyEnsemble):
        super().__init__(tgt_dict)
        self.local_vocabularies = [model]  # a list: not a submodule of the search

    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
        cand_scores, local_indices, cand_beams = super().step(
            step, lprobs, scores, prev_output_tokens, original_batch_idxs
        )
        bsz, beam_size, width = lprobs.size()
        words = self.local_vocabularies[0].words.view(bsz, beam_size * width)
        return cand_scores, words.gather(1, cand_beams * width + local_indices), cand_beams


class LeanSequenceGenerator(SequenceGenerator):
    """fairseq's SequenceGenerator with the lean beam step: beam search over local
    vocabularies (see the module's docstring) wherever it finds the same hypotheses as
    fairseq's own search, which it is otherwise (``lean`` False).

    The lean parts are built with the generator: fairseq's ``_generate`` reads the model, the
    search and the vocabulary's width from ``self``, and here they are the
    :class:`LocalVocabularyEnsemble` and its :class:`LocalVocabularyBeamSearch`, for good, and
    the width of the local vocabularies, which each call's candidates set
    (:meth:`LocalVocabularyEnsemble.select`). Prefix tokens and constraints index the full
    vocabulary: such calls go to ``full_vocabulary``, fairseq's own generator over the same
    models with the same options, built alongside, so that no part is swapped for a call.

    A sample with ``"candidates"`` (vocabulary selection: target ids, the special symbols
    first at their own ids; the batch's, or a row for each sentence) is translated with its
    models scoring those words only, and its hypotheses are in full dictionary ids; that
    needs the lean step.
    """

    def __init__(self, models, tgt_dict, **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        self.lean = self.lean_step_is_exact(tgt_dict)
        self.full_vocabulary: Optional[SequenceGenerator] = None
        if not self.lean:
            return
        self.full_vocabulary = SequenceGenerator(self.model, tgt_dict, **kwargs)
        model = LocalVocabularyEnsemble(list(self.model.models), tgt_dict.nspecial, self.beam_size)
        model.eval()
        self.model, self.search = model, LocalVocabularyBeamSearch(tgt_dict, model)
        if len(model.models) == 1 and all(p.device.type == "cpu" for p in model.parameters()):
            top_log_probs.load()  # built now, if need be, rather than during the first batch

    def lean_step_is_exact(self, tgt_dict) -> bool:
        """Whether the generator changes log-probabilities only of special symbols (by index)
        or of all words alike, and searches with plain beam search, over ConvS2S models."""
        specials = max(tgt_dict.bos(), tgt_dict.pad(), self.eos, self.unk)
        return (
            type(self.search) is search.BeamSearch
            and self.repeat_ngram_blocker is None
            and self.lm_model is None
            and not self.match_source_len
            and self.token_indices_to_suppress is None
            and all(getattr(model, "lean_beam_step_exact", False) for model in self.model.models)
            and specials < tgt_dict.nspecial
        )

    def _generate(self, sample, prefix_tokens=None, constraints=None, bos_token=None):
        candidates = sample.get("candidates")
        if self.lean and prefix_tokens is None and constraints is None:
            self.vocab_size = self.model.select(candidates, self.full_vocabulary.vocab_size)
            return super()._generate(sample, prefix_tokens, constraints, bos_token)
        if candidates is not None:
            raise ValueError("vocabulary selection needs plain beam search without prefix "
                             "tokens or constraints (--prefix-size, --constraints)")
        if self.lean:  # prefix tokens or constraints: over the full vocabulary
            return self.full_vocabulary._generate(sample, prefix_tokens, constraints, bos_token)
        return super()._generate(sample, prefix_tokens, constraints, bos_token)


class LeanSequenceGeneratorWithAlignment(SequenceGeneratorWithAlignment, LeanSequenceGenerator):
    """fairseq's SequenceGeneratorWithAlignment (``--print-alignment``) with the lean beam
    step: its ``generate`` calls ``super()._generate``, which is the lean one."""
