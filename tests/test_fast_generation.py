"""Beam search reads each source once per sentence: the encoder output is shared by a
sentence's hypotheses, a beam's reordering copies nothing, and each attention's projections
of the source are made once per sentence; the first convolution's products are made once
per word (see bench/README.md)."""
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from model_helpers import build, random_tokens, with_random_biases

ODD_SHAPES = dict(
    encoder_layers="[(16, 3), (24, 2), (24, 1), (16, 4)]",
    decoder_layers="[(16, 2), (24, 3), (24, 1), (16, 4)]",
    decoder_attention="[True, False, True, True]",
)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def encode(model, d, batch=3, length=6):
    src = random_tokens(d, batch, length)
    src[1, :2] = d.pad()
    return model.encoder(src, src.ne(d.pad()).sum(1)), src


def expand(encoder_out, order):
    """The encoder output with one row per decoder row, as a plain index_select gives it."""
    mask = encoder_out["encoder_padding_mask"]
    return {"encoder_out": tuple(t.index_select(0, order) for t in encoder_out["encoder_out"]),
            "encoder_padding_mask": None if mask is None else mask.index_select(0, order)}


def beam_steps(model, encoder_out, tgt, reorders, **decoder_options):
    """The decoder's logits step by step over hypotheses ``tgt`` (one row each), as a beam
    search makes them: before step t in ``reorders`` the rows are reordered (row r continues
    row ``reorders[t][r]``; fewer rows when a sentence finished). Each step gives the logits
    as returned and a copy taken at once, and the incremental state is returned too."""
    state, rows, steps = {}, tgt, []
    for t in range(tgt.size(1)):
        if t in reorders:
            new_order = reorders[t]
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            rows = torch.cat([rows[new_order, :t], tgt[: len(new_order), t:]], 1)
        logits = model.decoder(rows[:, : t + 1], encoder_out, incremental_state=state, **decoder_options)[0]
        steps.append((logits, logits.clone()))
    return steps, state


def test_beam_reorders_share_the_encoder_output():
    model, d = build(**ODD_SHAPES)
    model.eval()
    with torch.no_grad():
        encoder_out, _ = encode(model, d)
    z = encoder_out["encoder_out"][0]
    beam = 4
    # The generator's expansion to `beam` rows per sentence copies nothing.
    expanded = model.encoder.reorder_encoder_out(encoder_out, torch.arange(3).repeat_interleave(beam))
    assert expanded["beam"] == beam and expanded["encoder_out"][0] is z
    # Hypotheses reordered within their sentence: nothing copied either.
    within = torch.tensor([1, 1, 0, 3, 4, 6, 6, 6, 11, 8, 9, 9])
    reordered = model.encoder.reorder_encoder_out(expanded, within)
    assert reordered["encoder_out"][0] is z and reordered["beam"] == beam
    # A finished sentence leaves the batch: one row per remaining sentence.
    shrunk = model.encoder.reorder_encoder_out(reordered, torch.tensor([0, 1, 2, 3, 9, 8, 10, 11]))
    assert shrunk["beam"] == beam
    torch.testing.assert_close(shrunk["encoder_out"][0], z[[0, 2]], rtol=0, atol=0)
    # An order that mixes sentences within a group: one row per decoder row again.
    mixed = model.encoder.reorder_encoder_out(shrunk, torch.tensor([0, 4, 1, 2]))
    assert mixed["beam"] == 1
    torch.testing.assert_close(mixed["encoder_out"][1], encoder_out["encoder_out"][1][[0, 2, 0, 0]], rtol=0, atol=0)
    torch.testing.assert_close(mixed["encoder_padding_mask"], encoder_out["encoder_padding_mask"][[0, 2, 0, 0]])


@pytest.mark.parametrize("incremental", [False, True])
def test_shared_encoder_output_gives_the_same_outputs(incremental):
    model, d = build(**ODD_SHAPES)
    model.eval()
    beam, steps = 3, 5
    order = torch.arange(3).repeat_interleave(beam)
    tgt = random_tokens(d, 3 * beam, steps)
    with torch.no_grad():
        encoder_out, _ = encode(model, d)
        shared = model.encoder.reorder_encoder_out(encoder_out, order)
        assert shared["beam"] == beam
        outputs = []
        for enc in (shared, expand(encoder_out, order)):
            if incremental:
                state, logits, attn = {}, [], []
                for t in range(steps):
                    out = model.decoder(tgt[:, : t + 1], enc, incremental_state=state)
                    logits.append(out[0])
                    attn.append(out[1]["attn"][0])
                outputs.append((torch.cat(logits, 1), torch.cat(attn, 1)))
            else:
                out = model.decoder(tgt, enc)
                outputs.append((out[0], out[1]["attn"][0]))
    torch.testing.assert_close(outputs[0][0], outputs[1][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs[0][1], outputs[1][1], atol=1e-6, rtol=0)


def test_projected_sources_follow_the_sentences_of_a_beam_search():
    """A beam search's steps with each attention's projections made once per sentence equal
    the layers' own projections of one encoder row per hypothesis, before and after a
    sentence finishes."""
    model, d = build(**ODD_SHAPES)
    with_random_biases(model).eval()
    beam, steps, finish_at = 3, 6, 3
    order = torch.arange(3).repeat_interleave(beam)
    # Hypotheses reordered within their sentences, then sentence 1 finishes.
    within = torch.tensor([1, 1, 0, 3, 5, 5, 8, 6, 7])
    shrink = torch.tensor([0, 1, 2, 6, 7, 8])
    tgt = random_tokens(d, 3 * beam, steps)
    outputs = []
    with torch.no_grad():
        encoder_out, _ = encode(model, d)
        for shared in (True, False):
            enc = model.encoder.reorder_encoder_out(encoder_out, order) if shared else expand(encoder_out, order)
            logits, state = beam_steps(model, enc, tgt, {1: within, finish_at: shrink})
            sources = model.decoder.get_incremental_state(state, "projected_sources")
            assert (sources is not None) == shared
            if shared:
                assert sources.rows == len(sources.layers[0].values) == 2
            outputs.append([out for out, _ in logits])
    for folded, own in zip(*outputs):
        torch.testing.assert_close(folded, own, atol=1e-5, rtol=1e-5)


def test_the_decoder_reorders_every_module_that_keeps_state():
    """A beam's reorder visits the decoder, its convolutions and W_o (its own list, instead of
    fairseq's search through every module at every step): those are all the modules that
    keep state, in the order fairseq's search would visit them."""
    model, _ = build(**ODD_SHAPES)
    keep_state = [m for m in model.decoder.modules() if hasattr(m, "reorder_incremental_state")]
    assert keep_state == [model.decoder, *model.decoder.convolutions, model.decoder.output_projection]


@pytest.mark.parametrize("overrides", [dict(), ODD_SHAPES])
def test_the_first_convolution_is_looked_up_per_word_met(overrides):
    """In incremental steps the first convolution reads only embeddings, which fc1 maps
    linearly: its output is the sum of each word's products, made the first time the search
    meets the word, and of the positions' part, one row a step. The steps equal the full
    forward's (with random biases: fc1's belongs to the positions' part), from the first
    step, whose window is mostly before the sentence, through a beam's reorder."""
    model, d = build(**overrides)
    with_random_biases(model).eval()
    order = torch.arange(3).repeat_interleave(2)
    tgt = random_tokens(d, 6, 7)
    tgt[:, 5] = tgt[0, 0]  # a word met again
    new_order = torch.tensor([1, 1, 2, 3, 5, 5])
    rows = []
    first = model.decoder.convolutions[0].linear
    hook = first.register_forward_hook(lambda module, inputs, output: rows.append(output.shape[:-1].numel()))
    with torch.no_grad():
        encoder_out, _ = encode(model, d)
        steps, state = beam_steps(model, model.encoder.reorder_encoder_out(encoder_out, order), tgt, {3: new_order})
        hook.remove()
        before = model.decoder(tgt, expand(encoder_out, order))[0]
        after = model.decoder(torch.cat([tgt[new_order, :3], tgt[:, 3:]], 1), expand(encoder_out, order[new_order]))[0]
    logits = torch.cat([out for out, _ in steps], 1)
    torch.testing.assert_close(logits[:, :3], before[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[:, 3:], after[:, 3:], atol=1e-5, rtol=1e-5)
    assert rows == [1] * tgt.size(1)  # the positions' part only
    table = model.decoder.get_incremental_state(state, "word_products")
    assert table.seen == len(tgt.unique())
    assert (table.index >= 0).sum() == table.seen


def test_with_dropout_kept_in_generation_the_first_convolution_is_computed():
    """--retain-dropout drops the embeddings and the convolution's input, so no word's
    products can be kept: every step computes the first convolution."""
    model, d = build()
    model.make_generation_fast_(retain_dropout=True)
    rows = []
    model.decoder.convolutions[0].linear.register_forward_hook(lambda module, inputs, output: rows.append(len(output)))
    with torch.no_grad():
        encoder_out, _ = encode(model, d)
        _, state = beam_steps(model, encoder_out, random_tokens(d, 3, 4), {})
    assert rows == [3] * 4
    assert model.decoder.get_incremental_state(state, "word_products") is None


@pytest.mark.parametrize("folded", [False, True])
def test_reused_logits_are_the_output_layer_s_in_one_tensor(folded):
    """With ``reuse_logits`` (the lean beam step's) every step writes the same values as
    the output layer's into one tensor, as the rows shrink; without it, each step's logits
    are a tensor of their own, which later steps leave alone."""
    model, d = build(**ODD_SHAPES)
    with_random_biases(model).eval()
    if folded:
        model.make_generation_fast_()
    order = torch.arange(3).repeat_interleave(2)
    tgt = random_tokens(d, 6, 4)
    finishes = {2: torch.tensor([0, 1, 4, 5])}  # sentence 1 finishes
    with torch.no_grad():
        encoder_out, _ = encode(model, d)
        runs = {reuse: beam_steps(model, model.encoder.reorder_encoder_out(encoder_out, order), tgt, finishes,
                                  reuse_logits=reuse)[0]
                for reuse in (True, False)}
    assert len({out.data_ptr() for out, _ in runs[True]}) == 1
    assert len({out.data_ptr() for out, _ in runs[False]}) == 4
    for (_, reused), (_, own) in zip(runs[True], runs[False]):
        assert torch.equal(reused, own)


def test_reused_logits_are_not_used_under_autocast():
    """Under autocast the output layer is F.linear's, in the low-precision dtype."""
    model, d = build()
    model.eval()
    tgt = random_tokens(d, 3, 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        encoder_out, _ = encode(model, d)
        state = {}
        logits = model.decoder(tgt, encoder_out, incremental_state=state, reuse_logits=True)[0]
    assert logits.dtype == torch.bfloat16
    assert model.decoder.get_incremental_state(state, "logits") is None


def test_beam_search_with_shared_encoder_output_finds_the_same_hypotheses():
    """The same beam search with the sharing turned off (a reorder that copies every row)."""
    model, d = build(**ODD_SHAPES)
    with_random_biases(model).eval()
    src = random_tokens(d, 4, 7)
    src[2, :3] = d.pad()
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}}
    shared = SequenceGenerator([model], d, beam_size=5, max_len_b=10).generate([model], sample)
    model.encoder.reorder_encoder_out = lambda encoder_out, new_order: expand(encoder_out, new_order)
    copied = SequenceGenerator([model], d, beam_size=5, max_len_b=10).generate([model], sample)
    for a, b in zip(shared, copied):
        for x, y in zip(a, b):
            assert torch.equal(x["tokens"], y["tokens"])
            torch.testing.assert_close(x["positional_scores"], y["positional_scores"], atol=1e-5, rtol=0)
            torch.testing.assert_close(x["attention"], y["attention"], atol=1e-6, rtol=0)


def test_beam_search_with_projected_sources_runs_under_autocast():
    """--autocast-bf16 (and fairseq's --fp16 on a GPU) run the projected sources in the
    low-precision dtype with the rest of the step; the hypotheses are a beam search's."""
    model, d = build()
    model.eval()
    src = random_tokens(d, 3, 7)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hypos = SequenceGenerator([model], d, beam_size=3, max_len_b=5).generate([model], sample)
    assert all(len(h) == 3 and h[0]["tokens"][-1] == d.eos() for h in hypos)


@pytest.mark.parametrize("print_alignment", [False, True])
def test_attention_is_returned_only_when_alignments_are_wanted(print_alignment):
    """As fairseq-generate prepares a model: without --print-alignment the decoder returns no
    attention, so beam search keeps no attention buffer; the hypotheses are the same."""
    from omegaconf import OmegaConf

    model, d = build(**ODD_SHAPES)
    src = random_tokens(d, 4, 7)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}}
    model.eval()
    with_attention = SequenceGenerator([model], d, beam_size=5, max_len_b=10).generate([model], sample)
    model.prepare_for_inference_(OmegaConf.create({"generation": {"beam": 5, "print_alignment": print_alignment}}))
    hypos = SequenceGenerator([model], d, beam_size=5, max_len_b=10).generate([model], sample)
    for a, b in zip(hypos, with_attention):
        assert torch.equal(a[0]["tokens"], b[0]["tokens"])
        assert (a[0]["attention"].numel() > 0) == print_alignment  # fairseq: empty without attention
