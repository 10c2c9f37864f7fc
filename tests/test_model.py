"""Unit tests of the model's equations (paper sections 3.1 to 3.5)."""
import math

import pytest
import torch

from fairseq_convs2s_ext.modules import GLUConvolution, parse_attention, parse_layers
from model_helpers import build, random_tokens, with_random_biases

# Widths that differ (residual projections), kernel width 1 and even kernel widths.
ODD_SHAPES = dict(
    encoder_layers="[(16, 3), (24, 2), (24, 1), (16, 4)]",
    decoder_layers="[(16, 2), (24, 3), (24, 1), (16, 4)]",
    decoder_attention="[True, False, True, True]",
)
ARCHS = [dict(), ODD_SHAPES]


def forward(model, src, tgt, **kwargs):
    return model(src, torch.full((src.size(0),), src.size(1)), tgt, **kwargs)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("overrides", ARCHS)
def test_shapes(overrides):
    model, d = build(**overrides)
    logits, extra = forward(model, random_tokens(d, 3, 7), random_tokens(d, 3, 5))
    assert logits.shape == (3, 5, len(d))
    assert extra["attn"][0].shape == (3, 5, 7)


@pytest.mark.parametrize("overrides", ARCHS)
def test_decoder_is_causal(overrides):
    """Changing target token j leaves every output i < j unchanged, and changes output j."""
    model, d = build(**overrides)
    model.eval()
    src, tgt = random_tokens(d, 2, 6), random_tokens(d, 2, 8)
    before = forward(model, src, tgt)[0]
    for j in range(tgt.size(1)):
        changed = tgt.clone()
        changed[:, j] = (changed[:, j] - d.nspecial + 1) % (len(d) - d.nspecial) + d.nspecial
        after = forward(model, src, changed)[0]
        torch.testing.assert_close(after[:, :j], before[:, :j], rtol=0, atol=0)
        assert not torch.allclose(after[:, j], before[:, j])


@pytest.mark.parametrize("overrides", ARCHS)
def test_incremental_equals_full_forward_with_beam_reordering(overrides):
    model, d = build(**overrides)
    model.eval()
    batch, length = 4, 9
    src, tgt = random_tokens(d, batch, 6), random_tokens(d, batch, length)
    src[1, :2] = d.pad()  # left padding, as fairseq batches sources
    reorder_at, new_order = 4, torch.tensor([2, 2, 0, 3])
    # After the reorder, row r continues the prefix of row new_order[r].
    expected_tokens = torch.cat([tgt[new_order, :reorder_at], tgt[:, reorder_at:]], dim=1)
    src_lengths = src.ne(d.pad()).sum(1)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths)
        state = {}
        steps, attn = [], []
        for t in range(length):
            if t == reorder_at:
                model.decoder.reorder_incremental_state_scripting(state, new_order)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            prefix = (tgt if t < reorder_at else expected_tokens)[:, : t + 1]
            logits, extra = model.decoder(prefix, encoder_out, incremental_state=state)
            steps.append(logits)
            attn.append(extra["attn"][0])
        full_logits, full_extra = model(src[new_order], src_lengths[new_order], expected_tokens)
    torch.testing.assert_close(torch.cat(steps, 1)[:, reorder_at:], full_logits[:, reorder_at:], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(attn, 1)[:, reorder_at:], full_extra["attn"][0][:, reorder_at:],
                               atol=1e-5, rtol=0)
    # Before the reorder the steps match the original rows.
    with torch.no_grad():
        original = model(src, src_lengths, tgt)[0]
    torch.testing.assert_close(torch.cat(steps, 1)[:, :reorder_at], original[:, :reorder_at], atol=1e-5, rtol=0)


def test_incremental_step_buffers_only_k_inputs():
    """A step's cost does not grow with the prefix: each convolution keeps exactly k inputs,
    but the first, which keeps its products with each word met (``first_convolution_looked_up``)."""
    model, d = build(**ODD_SHAPES)
    model.eval()
    src, tgt = random_tokens(d, 2, 5), random_tokens(d, 2, 12)
    state = {}
    with torch.no_grad():
        encoder_out = model.encoder(src)
        for t in range(tgt.size(1)):
            model.decoder(tgt[:, : t + 1], encoder_out, incremental_state=state)
    first, *others = model.decoder.convolutions
    assert first.get_incremental_state(state, "window") is None
    assert model.decoder.get_incremental_state(state, "word_products").seen == len(tgt.unique())
    for conv in others:
        window = conv.get_incremental_state(state, "window")
        if conv.kernel_width == 1:
            assert window is None
        else:
            assert window.shape == (2, conv.kernel_width, conv.in_channels)


def test_a_step_uses_the_current_weights():
    """Weight normalization's g changed in place (an optimizer step) reaches the next step."""
    conv = GLUConvolution(4, 3, kernel_width=2, causal=True)
    x = torch.randn(2, 1, 4)
    with torch.no_grad():
        first = conv(x, incremental_state={})
        conv.linear.parametrizations.weight.original0.mul_(3.0)  # g, in place, as an optimizer step
        second = conv(x, incremental_state={})
        expected = torch.nn.functional.glu(
            torch.nn.functional.linear(torch.cat([torch.zeros(2, 1, 4), x], 2), conv.linear.weight, conv.linear.bias),
            dim=-1,
        )
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, expected)


def test_a_step_applies_every_reorder_since_the_last_one_in_turn():
    """A causal convolution's steps equal the convolution over each row's own history when
    the rows are reordered twice between two steps (the first step's copies to a beam, then
    a search's reorder), to more rows and to fewer, and when no reorder comes between."""
    torch.manual_seed(0)
    conv = GLUConvolution(4, 3, kernel_width=3, causal=True).eval()
    inputs = torch.randn(6, 5, 4)
    reorders = {1: [torch.tensor([0, 0, 1, 1, 1, 0]), torch.tensor([5, 1, 2, 2, 3, 0])],
                3: [torch.tensor([3, 1, 4])]}
    state, history = {}, inputs[:2, :0]
    with torch.no_grad():
        for t in range(inputs.size(1)):
            for order in reorders.get(t, []):
                conv.reorder_incremental_state(state, order)
                history = history[order]
            x = inputs[: len(history), t : t + 1]
            history = torch.cat([history, x], 1)
            step = conv(x, incremental_state=state)
            torch.testing.assert_close(step, conv(history)[:, -1:])


@pytest.mark.parametrize("overrides", ARCHS)
def test_attention_rows_sum_to_one_and_ignore_padding(overrides):
    model, d = build(**overrides)
    src, tgt = random_tokens(d, 3, 7), random_tokens(d, 3, 4)
    src[0, :3] = d.pad()
    src[2, :1] = d.pad()
    attn = forward(model, src, tgt)[1]["attn"][0]
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 4))
    assert attn[0, :, :3].abs().max() == 0 and attn[2, :, :1].abs().max() == 0
    # Every attention layer, not just the average.
    encoder_out = model.encoder(src)
    g = model.decoder.embed(tgt)
    for attention in model.decoder.attention:
        if attention is not None:
            h = torch.randn(3, 4, attention.in_projection.in_features)
            a = attention(h, g, encoder_out)[1]
            torch.testing.assert_close(a.sum(-1), torch.ones(3, 4))
            assert a[0, :, :3].abs().max() == 0


def test_conditional_input_is_scaled_by_m_sqrt_1_over_m():
    """With uniform attention c = mean of the values times m * sqrt(1/m) (section 3.4)."""
    model, d = build()
    attention = model.decoder.attention[0]
    m = 5
    values = torch.randn(1, m, 32)
    encoder_out = {"encoder_out": (torch.zeros(1, m, 32), values), "encoder_padding_mask": None}
    h, g = torch.zeros(1, 1, 32), torch.zeros(1, 1, 32)
    with torch.no_grad():
        out, a = attention(h, g, encoder_out)
        c = values.mean(1, keepdim=True) * (m * math.sqrt(1 / m))
        expected = (attention.out_projection(c) + h) * math.sqrt(0.5)
    torch.testing.assert_close(a, torch.full((1, 1, m), 1 / m))
    torch.testing.assert_close(out, expected)


def test_padding_invariance():
    """A sentence scores the same alone and in a padded batch (left-padded source, right-padded target)."""
    model, d = build(**ODD_SHAPES)
    model.eval()
    short_src, short_tgt = random_tokens(d, 1, 4), random_tokens(d, 1, 3)
    long_src, long_tgt = random_tokens(d, 1, 9), random_tokens(d, 1, 7)
    src = torch.cat([torch.cat([torch.full((1, 5), d.pad()), short_src], 1), long_src])
    tgt = torch.cat([torch.cat([short_tgt, torch.full((1, 4), d.pad())], 1), long_tgt])
    with torch.no_grad():
        alone = model(short_src, torch.tensor([4]), short_tgt)
        batched = model(src, torch.tensor([4, 9]), tgt)
    torch.testing.assert_close(batched[0][0, :3], alone[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(batched[1]["attn"][0][0, :3, 5:], alone[1]["attn"][0][0], atol=1e-6, rtol=0)


def _weight(linear):
    return linear.parametrizations.weight.original1  # v, equal to the weight at initialization


def test_initial_weights_follow_the_papers_formulas():
    dropout = 0.2
    p = 1 - dropout
    model, d = build(
        arch="convs2s_iwslt_de_en", vocab=2000, dropout=dropout,
        encoder_layers="[(256, 3), (512, 3)]", decoder_layers="[(256, 3)] * 2",
    )
    enc, dec = model.encoder, model.decoder

    def check(tensor, std):
        assert abs(tensor.std().item() / std - 1) < 0.05, (tensor.std().item(), std)
        assert abs(tensor.mean().item()) < 0.05 * std

    check(enc.embed.tokens.weight[d.nspecial :], 0.1)
    check(enc.embed.positions.weight[2:], 0.1)
    assert enc.embed.tokens.weight[d.pad()].abs().max() == 0
    check(_weight(enc.fc1), math.sqrt(p / 256))  # input: dropped-out embeddings
    check(_weight(enc.convolutions[0].linear), math.sqrt(4 * p / (3 * 256)))  # followed by a GLU
    check(_weight(enc.convolutions[1].linear), math.sqrt(4 * p / (3 * 256)))
    check(_weight(enc.residual_projections[1]), math.sqrt(1 / 256))
    check(_weight(enc.fc2), math.sqrt(1 / 512))
    check(_weight(dec.output_projection), math.sqrt(p / 256))  # input: the dropped-out decoder output
    check(_weight(dec.attention[0].in_projection), math.sqrt(1 / 256))
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            assert param.abs().max() == 0, name
    # Weight normalization starts at g = ||v||: the effective weight is the drawn one.
    torch.testing.assert_close(enc.fc1.weight, _weight(enc.fc1))


def test_weight_normalization_on_every_layer_but_lookup_tables():
    model, _ = build(**ODD_SHAPES)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            assert hasattr(module, "parametrizations"), name
        if isinstance(module, torch.nn.Embedding):
            assert not hasattr(module, "parametrizations"), name


def test_encoder_gradients_are_scaled_by_the_number_of_attention_layers():
    """Gradients reaching the encoder through z are divided by the number of attention layers;
    the decoder's gradients and the source embedding's direct path are untouched."""
    torch.manual_seed(0)
    model, d = build(**ODD_SHAPES, dropout=0.0)
    src, tgt = random_tokens(d, 2, 6), random_tokens(d, 2, 5)

    def grads(scale):
        model.zero_grad()
        model.encoder.gradient_scale = scale
        forward(model, src, tgt)[0].logsumexp(-1).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    scaled, unscaled, direct = grads(1.0 / 3), grads(1.0), grads(0.0)
    assert model.decoder.num_attention_layers == 3
    for name in scaled:
        if name.startswith("decoder."):
            torch.testing.assert_close(scaled[name], unscaled[name])
        elif name.startswith("encoder.embed."):
            # Two paths: through z (scaled) and directly into the values z + e (not scaled);
            # with the scale at 0 only the direct one is left, and it is not zero.
            assert direct[name].abs().sum() > 0, name
            through_z = unscaled[name] - direct[name]
            torch.testing.assert_close(scaled[name], direct[name] + through_z / 3, rtol=1e-4, atol=1e-7)
        else:
            torch.testing.assert_close(scaled[name] * 3, unscaled[name], rtol=1e-4, atol=1e-7)
    # The model is built with the paper's scale.
    fresh, _ = build(**ODD_SHAPES)
    assert fresh.encoder.gradient_scale == pytest.approx(1 / 3)


@pytest.mark.parametrize("overrides, fc2_folded", [
    (ODD_SHAPES, True),  # the last layer's 16 channels widen to 32 in fc2: folded into W_o
    (dict(decoder_layers="[(32, 3), (64, 3)]"), False),  # fc2 narrows 64 to 32: W_o W_2 would be wider
    (dict(share_input_output_embed=True), False),  # W_o is the input embeddings
])
def test_generation_fast_folds_weight_norm_and_fc2_without_changing_outputs(overrides, fc2_folded):
    model, d = build(**overrides)
    with_random_biases(model).eval()
    src, tgt = random_tokens(d, 2, 6), random_tokens(d, 2, 5)
    with torch.no_grad():
        before = forward(model, src, tgt)[0]
        model.prepare_for_inference_(model.cfg if hasattr(model, "cfg") and model.cfg else _inference_cfg())
        after = forward(model, src, tgt)[0]
    assert not any(hasattr(m, "parametrizations") for m in model.modules())
    assert isinstance(model.decoder.fc2, torch.nn.Identity) == fc2_folded
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_folded_output_layer_keeps_the_model_s_dtype():
    """fairseq-generate converts and moves the model before preparing it: the folded layer
    is made where the model's weights are, in their dtype."""
    model, d = build()
    model.double().make_generation_fast_()
    assert model.decoder.output_projection.weight.dtype == model.decoder.output_projection.bias.dtype == torch.float64
    assert model.decoder.output_projection.weight.device == model.decoder.embed.tokens.weight.device


def test_fc2_is_not_folded_when_dropout_is_kept_in_generation():
    """--retain-dropout drops fc2's output before W_o: the two layers cannot be one."""
    model, d = build()
    model.make_generation_fast_(retain_dropout=True)
    assert isinstance(model.decoder.fc2, torch.nn.Linear)


def _inference_cfg():
    from fairseq.dataclass.configs import FairseqConfig
    from omegaconf import OmegaConf

    return OmegaConf.structured(FairseqConfig)


def test_too_long_input_is_an_error_not_a_truncation():
    model, d = build(max_positions=10)
    with pytest.raises(ValueError, match="longer than the model's 10 positions"):
        forward(model, random_tokens(d, 1, 11), random_tokens(d, 1, 3))
    forward(model, random_tokens(d, 1, 10), random_tokens(d, 1, 10))  # all 10 positions are usable


def test_layer_specs_are_parsed_without_eval():
    assert parse_layers("[(512, 3)] * 2 + [(2048, 1)]") == [(512, 3), (512, 3), (2048, 1)]
    assert parse_layers("[(512, 3, 1)]") == [(512, 3)]
    assert parse_attention("True", 3) == [True] * 3
    assert parse_attention("[True, False]", 2) == [True, False]
    for bad in ["__import__('os').system('true')", "[(512, 3)] * 2 ** 40", "[(512, 3, 2)]", "[]", "[(0, 3)]"]:
        with pytest.raises(ValueError):
            parse_layers(bad)
    with pytest.raises(ValueError, match="list of 3 booleans"):
        parse_attention("[True]", 3)
    with pytest.raises(ValueError, match="at least one decoder layer"):
        build(decoder_attention="False")


@pytest.mark.parametrize("arch, layers", [
    ("convs2s_wmt_en_ro", [(512, 3)] * 20),
    ("convs2s_wmt_en_de", [(512, 3)] * 10 + [(768, 3)] * 3 + [(2048, 1)] * 2),
    ("convs2s_wmt_en_fr", [(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1), (4096, 1)]),
    ("convs2s_gigaword", [(256, 3)] * 6),
])
def test_paper_architectures(arch, layers):
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    assert parse_layers(args.encoder_layers) == layers and parse_layers(args.decoder_layers) == layers
    overridden = argparse.Namespace(encoder_embed_dim=128, decoder_layers="[(64, 5)]")
    ARCH_CONFIG_REGISTRY[arch](overridden)
    assert overridden.encoder_embed_dim == 128 and overridden.decoder_layers == "[(64, 5)]"


def test_a_checkpoint_that_names_w_o_fc3_loads_as_the_same_model():
    """Checkpoints saved before W_o was named ``output_projection`` hold it under fconv's
    name, ``decoder.fc3``: fairseq's loading (the decoder's upgrade_state_dict_named) reads
    them into the same weights and logits."""
    torch.manual_seed(0)
    model, d = build()
    with_random_biases(model).eval()
    saved = {k.replace("decoder.output_projection.", "decoder.fc3."): v.clone() for k, v in model.state_dict().items()}
    assert "decoder.fc3.bias" in saved and not any("output_projection" in k for k in saved)
    loaded, _ = build()
    loaded.load_state_dict(saved)
    loaded.eval()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    src, tgt = random_tokens(d, 2, 5), random_tokens(d, 2, 4)
    with torch.no_grad():
        assert torch.equal(loaded(src, None, tgt)[0], model(src, None, tgt)[0])
