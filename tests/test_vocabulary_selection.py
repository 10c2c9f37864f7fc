"""Vocabulary selection (``--vocab-selection``): fairseq-lua's candidate rule, the output
layer over the candidates in training and generation, and hypotheses in full dictionary ids."""
import math
import re
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.data import Dictionary

from fairseq_convs2s_ext.criterions import ConvS2SCrossEntropyCriterion
from fairseq_convs2s_ext.data import NO_WORD, CandidatesFileError, VocabularySelection, local_indices
from fairseq_convs2s_ext.data.vocabulary_selection import dictionary_words
from fairseq_convs2s_ext.generation import LeanSequenceGenerator
from fairseq_convs2s_ext.tasks.convs2s_translation import ConvS2STranslationConfig, ConvS2STranslationTask
from model_helpers import build, random_tokens, with_random_biases
from model_helpers import dictionary as dictionary_of


def dictionary(words):
    d = Dictionary()
    for w in words:
        d.add_symbol(w)
    return d


SRC = dictionary(["a", "b", "c", "d"])
TGT = dictionary([f"x{i}" for i in range(10)])
CANDIDATES = [
    "a x3 5 x1 3 zz 2 x7 1",  # zz is not a target word: skipped before taking the top K
    "b x9 4 x8 4",
    "c x5 1",
    "q x6 7",  # q is not a source word (a truncated dictionary): never a source of the batch
]  # the most often aligned targets: x6 7, x3 5, x8 4, x9 4, x1 3, ...


def write(tmp_path, lines, name="candidates"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def ids(d, words):
    return [d.index(w) for w in words]


def test_lua_candidate_rule_on_a_hand_made_case(tmp_path):
    selection = VocabularySelection.from_file(write(tmp_path, CANDIDATES), SRC, TGT, most_common=2, top_aligned=2)
    src = torch.tensor([[SRC.pad(), SRC.index("a"), SRC.index("b"), SRC.eos()],
                        [SRC.index("a"), SRC.unk(), SRC.index("a"), SRC.eos()]])
    specials = list(range(TGT.nspecial))
    most_common = ids(TGT, ["x6", "x3"])  # q's x6 counts: the target side's frequency
    aligned = ids(TGT, ["x3", "x1", "x9", "x8"])  # a: x3 x1 (top 2 known), b: x9 x8; not c
    generation = selection.candidates(src)
    assert generation.tolist() == sorted(set(specials + most_common + aligned))
    target = torch.tensor([[TGT.index("x4"), TGT.index("x0"), TGT.eos()], [TGT.index("x6"), TGT.eos(), TGT.pad()]])
    training = selection.candidates(src, target)
    assert training.tolist() == sorted(set(generation.tolist() + ids(TGT, ["x4", "x0", "x6"])))
    # specials first at their own ids; local indices map back to full ids
    assert training[: TGT.nspecial].tolist() == specials
    local = local_indices(training, target)
    assert torch.equal(training[local], target) and local[1, 2] == TGT.pad()
    # no source word with candidates, no most common: the specials alone
    none = VocabularySelection.from_file(write(tmp_path, CANDIDATES), SRC, TGT, most_common=0, top_aligned=5)
    assert none.candidates(torch.tensor([[SRC.index("d"), SRC.eos()]])).tolist() == specials
    everything = VocabularySelection.from_file(write(tmp_path, CANDIDATES), SRC, TGT, most_common=10 ** 6, top_aligned=1)
    assert everything.candidates(src).tolist() == list(range(len(TGT)))


def test_the_most_common_words_are_the_target_side_s_in_a_joint_dictionary(tmp_path):
    """A dictionary shared by both languages (fairseq-preprocess --joined-dictionary, as for
    BPE) is ordered by both sides' counts, so its first words may be source words that the
    target never has. The most common target words are those the training data's target side
    has aligned most often, whatever the dictionary's order."""
    joint = dictionary(["the", "a", "of", "die", "der", "und"])  # English heads the joint order
    lines = ["the die 9 der 4", "a eine 3 die 2", "of der 5 des 1", "and und 6", "die"]  # die: none aligned
    selection = VocabularySelection.from_file(write(tmp_path, lines), joint, joint, most_common=3, top_aligned=1)
    none_aligned = torch.tensor([[joint.eos()]])
    assert selection.candidates(none_aligned).tolist() == sorted(
        list(range(joint.nspecial)) + ids(joint, ["die", "der", "und"]))  # 11, 9, 6; not "the", "a", "of"


def test_generation_takes_each_sentence_s_own_candidates(tmp_path):
    """In generation each sentence gets the Lua rule applied to it alone: row b holds what
    the batch rule gives sentence b by itself. The words scored for every hypothesis come
    first, at one column in every row: the specials, the most common, then those that 1 in
    COMMON_SHARE (4) of the sentences have, NO_WORD where a sentence lacks one. Then each
    sentence's other words, padded with NO_WORD."""
    selection = VocabularySelection.from_file(write(tmp_path, CANDIDATES), SRC, TGT, most_common=2, top_aligned=2)
    a, b, c, d = (SRC.index(w) for w in "abcd")
    pad, eos = SRC.pad(), SRC.eos()
    src = torch.tensor([[a, b, eos], [pad, c, eos], [pad, d, eos], [pad, a, eos], [pad, b, eos]])
    rows = selection.candidates_per_sentence(src)
    alone = [selection.candidates(src[s: s + 1]).tolist() for s in range(len(src))]
    always = list(range(TGT.nspecial)) + ids(TGT, ["x3", "x6"])
    x1, x5, x8, x9 = ids(TGT, ["x1", "x5", "x8", "x9"])  # x1 (a), x8 and x9 (b): 2 sentences of 5 each
    assert rows.tolist() == [always + [x1, x8, x9, NO_WORD],
                             always + [NO_WORD, NO_WORD, NO_WORD, x5],  # x5 (c): 1 sentence of 5
                             always + [NO_WORD] * 4,
                             always + [x1, NO_WORD, NO_WORD, NO_WORD],
                             always + [NO_WORD, x8, x9, NO_WORD]]
    for row, words in zip(rows.tolist(), alone):
        assert sorted(w for w in row if w != NO_WORD) == words
    one = selection.candidates_per_sentence(src[:1])  # a sentence alone: each word is its sentence's
    assert one.tolist() == [always + [x1, x8, x9]]


def test_a_sentence_alone_gets_the_batch_rule_s_row_by_its_shorter_way():
    """A batch of one sentence (a server translating each request alone) takes its own few
    operations: the batch rule's row, and every column shared, bit for bit, on random tables
    (repeated and padded source words, aligned words among the most common)."""
    from convs2s_serving import candidates as rule

    generator = torch.Generator().manual_seed(0)
    for trial in range(50):
        vocabulary, sources = 60, 30
        aligned = torch.randint(0, vocabulary, (sources, 1 + trial % 5), generator=generator, dtype=torch.int32)
        common = torch.randperm(vocabulary - 4, generator=generator)[:trial % 7] + 4
        always = torch.cat([torch.arange(4), common]).sort().values
        src = torch.randint(0, sources, (1, 1 + trial % 9), generator=generator)
        row = rule.candidates_per_sentence(aligned, always, vocabulary, src)
        assert torch.equal(row, rule._batch(aligned, always, vocabulary, src)), trial
        words, width = rule.shared_columns(row)
        shared, shared_width = rule._shared_of_batch(row)
        assert width == shared_width == row.size(1) and torch.equal(words, shared), trial


def test_per_sentence_candidates_translate_each_sentence_as_alone():
    """A batch translated with each sentence's candidates gives every sentence the
    hypotheses and scores it gets when translated alone with its candidates, while
    sentences finish at different steps and fairseq shrinks and reorders the batch; words
    that several sentences share sit in one column of every row (scored for every
    hypothesis), the others are each sentence's own."""
    torch.manual_seed(0)
    model, d = build(vocab=80)
    model.eval()
    with torch.no_grad():  # end sentences early and at different steps
        model.decoder.output_projection.bias[d.eos()] += 0.15
    src = random_tokens(d, 6, 7)
    generator = LeanSequenceGenerator([model], d, beam_size=3, max_len_b=12)
    specials = torch.arange(d.nspecial)
    words = torch.randperm(len(d) - d.nspecial) + d.nspecial
    common, others = words[:6], words[6:]  # words some sentences share, in one column of every row
    has = torch.rand(len(src), len(common)) < 0.5
    own = [others[torch.randperm(len(others))[: 10 + 7 * b]].sort().values for b in range(len(src))]
    candidates = torch.full((len(src), d.nspecial + len(common) + len(own[-1])), NO_WORD)
    for b in range(len(src)):
        row = torch.cat([specials, torch.where(has[b], common, NO_WORD), own[b]])
        candidates[b, : len(row)] = row
    rows = [row[row.ge(0)].sort().values for row in candidates]  # each sentence's words, sorted
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((len(src),), 7)}}
    batch = generator.generate([model], dict(sample, candidates=candidates))
    lengths = set()
    for b, nbest in enumerate(batch):
        one = {"net_input": {"src_tokens": src[b: b + 1], "src_lengths": torch.tensor([7])}}
        (alone,) = generator.generate([model], dict(one, candidates=rows[b]))
        for x, y in zip(nbest, alone):
            assert torch.equal(x["tokens"], y["tokens"])
            assert set(x["tokens"].tolist()) <= set(rows[b].tolist())
            torch.testing.assert_close(x["positional_scores"], y["positional_scores"], rtol=1e-5, atol=1e-5)
        lengths.add(len(nbest[0]["tokens"]))
    assert len(lengths) > 2  # the sentences ended at different steps


def test_a_beam_search_keeps_one_copy_of_each_sentence_s_own_rows():
    """Generation memory and work: the words in one column of every sentence's candidates
    (specials, most common, and words that many sentences share, absent from some) are
    scored for every hypothesis with W_o's rows (its own when they are in place), -inf where
    a sentence lacks the word; only each sentence's other words' rows are gathered, once, and
    when sentences finish the rows left move down in the same tensor."""
    torch.manual_seed(0)
    model, d = build(vocab=60)
    model.eval()
    decoder = model.decoder
    shared = d.nspecial + 5
    common = [[45, NO_WORD], [45, 50], [NO_WORD, 50]]  # the same word in a column, or none
    own = [[20, 30], [21, 31, 41], [22, 32, 42, 52]]
    candidates = torch.full((3, shared + 2 + 4), NO_WORD)
    for b in range(3):
        row = torch.cat([torch.arange(shared), torch.tensor(common[b] + own[b])])
        candidates[b, : len(row)] = row
    beam, src = 2, random_tokens(d, 3, 5)
    encoder_out = encoder_out_of(model, src, beam)
    state, full_state, prev = {}, {}, torch.full((3 * beam, 1), d.eos())
    with torch.no_grad():
        logits, _ = decoder(prev, encoder_out, state, candidates=candidates)
        full, _ = decoder(prev, encoder_out, full_state)
    assert_each_sentence_scores_its_words(logits, full, candidates, beam)
    kept = decoder.output_projection.get_incremental_state(state, "candidate_rows")
    assert len(kept.shared_weight) == shared + 2 and kept.own_weight.shape == (3, 4, decoder.output_projection.in_features)
    assert kept.absent.isinf().tolist() == [[False] * shared + [False, True], [False] * (shared + 2),
                                               [False] * shared + [True, False]]
    everything_state = {}
    with torch.no_grad():  # every word in every row: W_o's own rows, no rows gathered
        everything, _ = decoder(prev, encoder_out, everything_state, candidates=torch.arange(len(d)).expand(3, -1))
    torch.testing.assert_close(everything, full)
    rows = decoder.output_projection.get_incremental_state(everything_state, "candidate_rows")
    assert rows.own_weight.numel() == 0 and rows.absent is None
    storage = kept.own_weight.data_ptr()
    new_order = torch.tensor([1, 0, 5, 4])  # sentence 1 finished
    decoder.reorder_incremental_state_scripting(state, new_order)
    decoder.reorder_incremental_state_scripting(full_state, new_order)
    kept = decoder.output_projection.get_incremental_state(state, "candidate_rows")
    assert kept.own_weight.data_ptr() == storage and len(kept.own_weight) == 2
    torch.testing.assert_close(kept.own_weight[1, :4], decoder.output_projection.weight[own[2]])
    prev = torch.tensor([[d.eos(), 45], [d.eos(), 20], [d.eos(), 50], [d.eos(), 52]])
    encoder_out = encoder_out_of(model, src[[0, 2]], beam)
    with torch.no_grad():  # the next step: each sentence left still scores its own words
        logits, _ = decoder(prev, encoder_out, state, candidates=candidates[[0, 2]])
        full, _ = decoder(prev, encoder_out, full_state)
    assert_each_sentence_scores_its_words(logits, full, candidates[[0, 2]], beam)


@pytest.mark.parametrize("quantized", [False, True], ids=["float32", "int8"])
@pytest.mark.parametrize("per_sentence", [False, True], ids=["the batch's candidates", "each sentence's"])
def test_a_beam_search_writes_every_step_s_logits_over_candidates_into_the_same_memory(per_sentence, quantized):
    """With ``reuse_logits`` (the lean step's), a step's logits over the candidates, and the
    product of the columns every sentence shares, are written over the last step's: no new
    tensors of logits each step (fresh memory, whose first touch costs time); the same
    numbers as new tensors get."""
    from fairseq_convs2s_ext.generation.quantization import quantize_

    torch.manual_seed(0)
    model, d = build(vocab=60)
    with_random_biases(model)
    model.eval()
    if quantized:
        quantize_([model])
    shared = torch.arange(d.nspecial + 5)
    if per_sentence:
        own = [[20, 30], [21, 31, 41], [22, 32, 42, 52]]
        candidates = torch.full((3, len(shared) + 4), NO_WORD)
        for b in range(3):
            candidates[b, : len(shared) + len(own[b])] = torch.cat([shared, torch.tensor(own[b])])
    else:
        candidates = torch.cat([shared, torch.tensor([20, 30, 45, 50])])
    beam, src = 2, random_tokens(d, 3, 5)
    encoder_out = encoder_out_of(model, src, beam)
    reused_state, new_state, written = {}, {}, []
    prev = torch.full((3 * beam, 1), d.eos())
    with torch.no_grad():
        for _ in range(3):
            logits, _ = model.decoder(prev, encoder_out, reused_state, candidates=candidates, reuse_logits=True)
            expected, _ = model.decoder(prev, encoder_out, new_state, candidates=candidates)
            assert torch.equal(logits, expected)
            written.append(logits)  # kept alive: one address is memory written over, not freed and taken again
            prev = torch.cat([prev, torch.randint(d.nspecial, len(d), (3 * beam, 1))], dim=1)
    assert len({logits.data_ptr() for logits in written}) == 1


def test_a_beam_search_s_first_step_is_computed_once_per_sentence():
    """At a beam search's first step every hypothesis of a sentence has the same prefix:
    the decoder computes one row per sentence and copies it, logits, attention and
    incremental state alike, with each sentence's candidates and over the full vocabulary,
    so that the first step and the next are those computed for every hypothesis."""
    torch.manual_seed(0)
    model, d = build(vocab=60)
    with_random_biases(model)
    model.eval()
    model.decoder.need_attn = True
    beam, src = 3, random_tokens(d, 4, 6)
    candidates = torch.full((4, d.nspecial + 12), NO_WORD)
    for b in range(4):
        candidates[b, : d.nspecial + 8 + b] = torch.cat([torch.arange(d.nspecial),
                                                         torch.randperm(50)[: 8 + b].sort().values + 10])
    encoder_out = model.encoder(src, torch.full((4,), 6))
    # fairseq's expansion to beam rows: one encoder row per sentence, read by its b hypotheses
    encoder_out = model.encoder.reorder_encoder_out(encoder_out, torch.arange(4).repeat_interleave(beam))
    assert encoder_out["beam"] == beam
    every_row = encoder_out_of(model, src, beam)  # a copy of the source for each hypothesis
    rows_seen = []
    hook = model.decoder.fc2.register_forward_hook(lambda module, inputs, output: rows_seen.append(len(output)))
    state, full_state, every_state = {}, {}, {}
    prev = torch.full((4 * beam, 1), d.eos())
    with torch.no_grad():
        logits, extra = model.decoder(prev, encoder_out, state, candidates=candidates)
        full, full_extra = model.decoder(prev, encoder_out, full_state, reuse_logits=True)
        every, every_extra = model.decoder(prev, every_row, every_state)
        different = torch.randint(d.nspecial, len(d), (4 * beam, 2))  # prefixes that differ: every row
        model.decoder(different, encoder_out, {}, candidates=candidates)
    hook.remove()
    assert rows_seen == [4, 4, 4 * beam, 4 * beam]  # once per sentence when the source is shared
    # the same numbers (bit for bit on the CPUs measured, but a matrix multiply's kernel
    # may depend on its number of rows)
    torch.testing.assert_close(full, every)
    torch.testing.assert_close(full_extra["attn"][0], every_extra["attn"][0])
    assert_each_sentence_scores_its_words(logits, full, candidates, beam)
    torch.testing.assert_close(extra["attn"][0], full_extra["attn"][0])
    new_order = torch.tensor([2, 0, 1, 3, 3, 4, 9, 10, 11])  # fairseq reorders; sentence 2 finished
    for s in (state, full_state, every_state):
        model.decoder.reorder_incremental_state_scripting(s, new_order)
    encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
    every_row = model.encoder.reorder_encoder_out(every_row, new_order)
    prev = torch.cat([prev[new_order], torch.randint(d.nspecial, len(d), (len(new_order), 1))], dim=1)
    with torch.no_grad():
        logits, _ = model.decoder(prev, encoder_out, state, candidates=candidates[[0, 1, 3]])
        full, _ = model.decoder(prev, encoder_out, full_state, reuse_logits=True)
        every, _ = model.decoder(prev, every_row, every_state)
    torch.testing.assert_close(full, every)  # the attention reads a shared source: up to rounding
    assert_each_sentence_scores_its_words(logits, full, candidates[[0, 1, 3]], beam)


def encoder_out_of(model, src, beam):
    return model.encoder(src.repeat_interleave(beam, 0), torch.full((len(src) * beam,), src.size(1)))


def assert_each_sentence_scores_its_words(logits, full, candidates, beam):
    """Logits over each sentence's candidates (``beam`` consecutive rows a sentence) are the
    full vocabulary's logits of its words, column by column, and -inf where it has none."""
    for b, row in enumerate(candidates.tolist()):
        hypotheses = slice(b * beam, (b + 1) * beam)
        words = [c for c, w in enumerate(row) if w != NO_WORD]
        torch.testing.assert_close(logits[hypotheses, :, words], full[hypotheses, :, [row[c] for c in words]])
        assert logits[hypotheses, :, [c for c, w in enumerate(row) if w == NO_WORD]].eq(float("-inf")).all()


@pytest.mark.parametrize("lines, message", [
    (CANDIDATES + ["d x2"], r"line 5: expected 'source target1 count1"),
    (CANDIDATES + ["d x2 two"], r"line 5: expected"),
    (CANDIDATES + ["d x2 0"], r"line 5: expected"),
    (["a x1 1 x2 3"] + CANDIDATES[1:], r"line 1: the targets of 'a' are not ranked"),
    (CANDIDATES + ["a x2 1"], r"line 5: source word 'a' again \(first on line 1\)"),
    # the languages swapped: no source word is in the source dictionary
    ([f"x{i} {w} 1" for i, w in enumerate("abcd")], r"does not fit the model's source dictionary: it names "
                                                    r"only 0 of its 4 words; e\.g\. line 1: 'x0'"),
    (["a zz 1", "b yy 2", "c x1 1"], r"does not fit the model's target dictionary: it names only 1 of its 10"),
    (None, r"no such file; write it with convs2s-align-dict --candidates"),
])
def test_a_candidates_file_that_does_not_fit_is_an_error_naming_file_and_line(tmp_path, lines, message):
    path = write(tmp_path, lines) if lines is not None else str(tmp_path / "missing")
    with pytest.raises(CandidatesFileError, match=rf"^{re.escape(path)}\W.*{message}"):
        VocabularySelection.from_file(path, SRC, TGT, most_common=2, top_aligned=2)


def batch(d, sentences=4, src_len=6, tgt_len=5):
    target = random_tokens(d, sentences, tgt_len)
    target[1, -2:] = d.pad()
    target[:, -1] = d.eos()
    prev = torch.cat([torch.full((sentences, 1), d.eos()), target[:, :-1]], 1)
    src = random_tokens(d, sentences, src_len)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.full((sentences,), src_len),
                          "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(d.pad()).sum())}


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_training_loss_is_the_cross_entropy_over_the_candidates(smoothing):
    """The criterion with a batch's candidates equals the full model's logits restricted to
    them (by plain indexing), log_softmax and fairseq's label-smoothed NLL; gradients reach
    only the candidates' output rows."""
    torch.manual_seed(0)
    model, d = build(vocab=60)
    model.train()
    criterion = ConvS2SCrossEntropyCriterion(
        ConvS2STranslationTask(ConvS2STranslationConfig(replace_unk=None), d, d), smoothing)
    sample = batch(d)
    candidates = torch.unique(torch.cat([torch.arange(d.nspecial), sample["target"].view(-1),
                                         torch.tensor([10, 20, 30])]))
    torch.manual_seed(1)  # the same dropout masks in both passes
    loss, sample_size, logging = criterion(model, dict(sample, candidates=candidates))
    loss.backward()
    selected_grad = model.decoder.output_projection.parametrizations.weight.original1.grad.clone()
    model.zero_grad()
    torch.manual_seed(1)
    logits = model(**sample["net_input"])[0][..., candidates]
    position = {int(c): i for i, c in enumerate(candidates)}
    target = torch.tensor([[position[int(t)] for t in row] for row in sample["target"]])
    expected, expected_nll = label_smoothed_nll_loss(
        F.log_softmax(logits, -1).view(-1, len(candidates)), target.view(-1), smoothing, ignore_index=d.pad())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logging["nll_loss"], expected_nll, rtol=1e-5, atol=1e-5)
    assert sample_size == sample["ntokens"]
    expected.backward()
    torch.testing.assert_close(selected_grad, model.decoder.output_projection.parametrizations.weight.original1.grad)
    unselected = torch.ones(len(d), dtype=torch.bool)
    unselected[candidates] = False
    assert selected_grad[unselected].abs().sum() == 0 and selected_grad[candidates].abs().sum() > 0


def test_generation_maps_hypotheses_back_to_full_ids():
    """Beam search over a batch's candidates: hypotheses in full dictionary ids, all of them
    candidates, with the positional scores of the full model's logits restricted to the
    candidates; with every word a candidate, the full vocabulary's hypotheses, bit for bit."""
    torch.manual_seed(0)
    model, d = build(vocab=80)
    model.eval()
    src = random_tokens(d, 5, 7)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((5,), 7)}}
    candidates = torch.cat([torch.arange(d.nspecial), torch.arange(d.nspecial + 3, len(d), 4)])
    generator = LeanSequenceGenerator([model], d, beam_size=4, max_len_b=8)
    selected = generator.generate([model], dict(sample, candidates=candidates))
    position = {int(c): i for i, c in enumerate(candidates)}
    for i, nbest in enumerate(selected):
        for hypo in nbest:
            tokens = hypo["tokens"]
            assert set(tokens.tolist()) <= set(candidates.tolist())
            prev = torch.cat([torch.tensor([d.eos()]), tokens[:-1]])[None]
            with torch.no_grad():
                logits = model(src[i: i + 1], torch.tensor([7]), prev)[0][0, :, candidates]
            local = torch.tensor([position[int(t)] for t in tokens])
            scores = F.log_softmax(logits, -1).gather(1, local[:, None]).squeeze(1)
            torch.testing.assert_close(hypo["positional_scores"], scores, rtol=1e-5, atol=1e-5)
    full = generator.generate([model], sample)
    every_word = generator.generate([model], dict(sample, candidates=torch.arange(len(d))))
    for a, b in zip(full, every_word):
        for x, y in zip(a, b):
            assert torch.equal(x["tokens"], y["tokens"]) and torch.equal(x["positional_scores"], y["positional_scores"])


def selection_task(tmp_path, d, rest_clusters, most_common=10):
    """The plugin's task with vocabulary selection on dictionary ``d`` (both sides): each
    source word's candidates are three target words."""
    words = [w for _, w in dictionary_words(d)]
    lines = [f"{w} {words[(7 * i) % len(words)]} 3 {words[(7 * i + 1) % len(words)]} 2 "
             f"{words[(7 * i + 3) % len(words)]} 1" for i, w in enumerate(words)]
    config = ConvS2STranslationConfig(replace_unk=None, vocab_selection=write(tmp_path, lines),
                                      vocab_most_common=most_common, vocab_top_aligned=3,
                                      vocab_rest_clusters=rest_clusters)
    return ConvS2STranslationTask(config, d, d)


def translated_and_scored(task, model, sentences=4, length=6):
    """Random sentences translated through the task (beam 3, each sentence's candidates):
    for each hypothesis, its positional scores and the full model's log-probabilities of its
    words, over the whole vocabulary and over its sentence's candidates alone (forced
    decoding)."""
    d = task.target_dictionary
    src = random_tokens(d, sentences, length)
    sample = {"id": torch.arange(sentences),
              "net_input": {"src_tokens": src, "src_lengths": torch.full((sentences,), length)}}
    generator = task.build_generator([model], Namespace(beam=3, max_len_b=8))
    candidates = task.vocabulary_selection.candidates_per_sentence(src)
    for b, nbest in enumerate(task.inference_step(generator, [model], sample)):
        words = candidates[b][candidates[b].ge(0)]
        for hypo in nbest:
            tokens = hypo["tokens"]
            assert set(tokens.tolist()) <= set(words.tolist())
            prev = torch.cat([torch.tensor([d.eos()]), tokens[:-1]])[None]
            with torch.no_grad():
                logits = model(src[b: b + 1], torch.tensor([length]), prev)[0][0]
            full = F.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
            over_candidates = logits[:, words].log_softmax(-1)[:, local_indices(words, tokens)].diagonal()
            yield hypo["positional_scores"], full, over_candidates


@pytest.mark.parametrize("rest_clusters", [0, 10 ** 6])
def test_generation_normalises_over_the_candidates_and_the_rest_of_the_vocabulary(tmp_path, rest_clusters):
    """fairseq-lua's softmax over a sentence's candidates alone (``--vocab-rest-clusters 0``)
    raises every score by the probability of the words left out. With the rest estimated
    and every word its own cluster, the normaliser is the full vocabulary's: a hypothesis's
    positional scores are the full model's log-probabilities of its words."""
    torch.manual_seed(0)
    model, d = build(vocab=80)
    with_random_biases(model)
    model.eval()
    task = selection_task(tmp_path, d, rest_clusters)
    for scores, full, over_candidates in translated_and_scored(task, model):
        torch.testing.assert_close(scores, over_candidates if rest_clusters == 0 else full, rtol=1e-5, atol=1e-5)
        assert (over_candidates > full + 1e-3).all()  # words were left out at every step


def test_the_rest_of_the_vocabulary_is_estimated_from_clusters_of_the_output_rows(tmp_path):
    """k-means clusters of the rows [W_o | b_o] of the words that a sentence may lack: each
    cluster's column is the log of its words' number plus their mean logit, at most the
    log-sum-exp of their logits (Jensen); in a beam search every score is below fairseq-lua's
    (the candidates alone), the words left out being counted."""
    torch.manual_seed(0)
    model, d = build(vocab=80)
    with_random_biases(model)
    model.eval()
    task = selection_task(tmp_path, d, rest_clusters=8)
    always = task.vocabulary_selection.always
    rest = torch.ones(len(d), dtype=torch.bool)
    rest[always] = False
    model.decoder.output_projection.estimate_rest(always, 8)
    clusters = model.decoder.output_projection.rest_clusters.labels
    assert clusters[always].eq(-1).all() and set(clusters[rest].tolist()) == set(range(8))
    no_own_words = always[None]  # a sentence with the words every sentence has only
    h = torch.randn(1, 1, model.decoder.output_projection.in_features)
    with torch.no_grad():
        logits = model.decoder.output_projection(h, no_own_words)[0, 0]
        full = model.decoder.output_projection(h)[0, 0]
    assert logits.size(0) == len(always) + 8
    torch.testing.assert_close(logits[:len(always)], full[always])
    for c in range(8):
        members = full[rest][clusters[rest] == c]
        torch.testing.assert_close(logits[len(always) + c], members.mean() + math.log(len(members)))
        assert logits[len(always) + c] <= members.logsumexp(0) + 1e-6
    for scores, full, over_candidates in translated_and_scored(task, model):
        assert (scores < over_candidates).all()


def test_a_negative_number_of_rest_clusters_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"--vocab-rest-clusters \(-1\) must not be negative"):
        selection_task(tmp_path, dictionary_of(80), rest_clusters=-1)
