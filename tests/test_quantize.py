"""int8 inference (``--quantize int8``, generation.quantization): the int8 layers are within
the error their scales allow of float32, the whole decoder stays close to its float32 self,
and fairseq-generate, fairseq-interactive and the hub translate with it; without it,
translation is what it was."""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from convs2s_serving.int8_linear import activation_levels, weight_levels

from cli_helpers import hypotheses, run
from fairseq_convs2s_ext import ConvS2SModel
from fairseq_convs2s_ext.generation.quantization import (
    Int8Attention, Int8Linear, Int8OutputProjection, Int8Weights, QuantizeOptionError, int8_layer, int8_linear, quantize_,
    quantize_weight,
)
from model_helpers import build, random_tokens, with_random_biases
from tiny_runs import USER_DIR, prepare, train

TEST_SENTENCES = 20  # tiny_runs.SPLITS' test lines
# The weights' step, and so the int8 error, is twice as large with 7-bit weights (a CPU without
# VNNI, where 8-bit ones would overflow oneDNN's int16 pair sums: weight_levels); the rows' step
# is with 7-bit activations (fbgemm's product, where torch._int_mm is slow: activation_levels)
COARSER = max(127 / weight_levels(), 127 / activation_levels())


def operands(rows=37, columns=96, outputs=50, seed=0):
    """x and a linear layer whose quantization scales differ a thousandfold between rows and
    between output channels: a row of small features and a channel of small weights."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, columns, generator=generator)
    x[3] *= 1e-3
    linear = nn.Linear(columns, outputs)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(outputs, columns, generator=generator))
        linear.weight[7] *= 1e-3
        linear.bias.copy_(torch.randn(outputs, generator=generator))
    return x, linear


def test_int8_layer_is_within_the_bound_of_its_per_row_and_per_channel_scales():
    """|x.w - x^.w^| <= s_i/2 ||x_m||_1 + r_m/2 ||w^_i||_1 for row m (scale r_m) and output
    channel i (scale s_i): each row and channel is as precise as its own scale allows, the
    small row and the small channel too (one scale for a whole matrix would not be)."""
    x, linear = operands()
    expected = linear(x).detach()
    layer = int8_layer(linear)
    got = layer(x).detach()
    q, s = quantize_weight(linear.weight.detach())
    w_hat = q.float() * s[:, None]
    r = x.abs().amax(1, keepdim=True) / activation_levels()
    bound = s / 2 * x.abs().sum(1, keepdim=True) + r / 2 * w_hat.abs().sum(1)
    slack = 1e-5 * (x.abs() @ linear.weight.detach().abs().t() + linear.bias.detach().abs())  # float32 rounding
    assert ((got - expected).abs() <= bound + slack).all()
    relative = (got - expected).abs() / (x.abs() @ linear.weight.detach().abs().t())
    assert relative[3].max() < 0.02 and relative[:, 7].max() < 0.02  # the small row and the small channel
    assert ((got - expected).norm() / expected.norm()) < 0.01 * COARSER


def test_int8_products_are_exact_integer_sums_converted_in_place():
    """The int32 sums of torch._int_mm (a private torch op: this fails if it changes), written
    into the float32 result's memory and converted there, equal the float64 products of the
    same int8 operands; also into a caller's tensor (W_o's reused logits)."""
    x, linear = operands(rows=5, columns=30, outputs=13)
    q, s = quantize_weight(linear.weight.detach())
    r = x.abs().amax(1, keepdim=True) / 127
    p = torch.round(x / r)
    exact = (p.double() @ q.double().t()) * r.double() * s.double() + linear.bias.detach().double()
    out = torch.full((5, 13), float("nan"))
    got = int8_linear(x, q.t(), s, linear.bias.detach(), out=out, product="int_mm")
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(int8_linear(x[None], q.t(), s, linear.bias.detach(), product="int_mm")[0], got)
    assert torch.equal(torch._int_mm(p.to(torch.int8), q.t()),
                       (p.long() @ q.long().t()).to(torch.int32))


AVX2_EXACTNESS = """
import torch
from convs2s_serving.int8_linear import weight_levels
from fairseq_convs2s_ext.generation.quantization import int8_linear, quantize_weight
generator = torch.Generator().manual_seed(0)
x, weight = torch.randn(640, 256, generator=generator), torch.randn(512, 256, generator=generator)
weight[:, :8] *= 20  # outlying weights, as trained layers have: many of a channel's int8 values near its largest
q, s = quantize_weight(weight)
r = x.abs().amax(1, keepdim=True) / 127
p = torch.round(x / r)
exact = (p.double() @ q.double().t()) * r.double() * s.double()
got = int8_linear(x, q.t(), s, torch.zeros(512))
print(weight_levels(), float((got.double() - exact).abs().max()))
"""


def test_int8_sums_are_exact_where_onednn_multiplies_without_vnni():
    """With oneDNN held to AVX2 (no VNNI: as on an AVX2 CPU), torch._int_mm adds pairs of
    products into a saturating int16, so 8-bit weights gave wrong sums (99% of them at random
    operands, and translations changed); the weights are then quantized to 7 bits, and
    the int8 layer's output is the exact product of its int8 operands again."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", CONVS2S_INT8_PRODUCT="int_mm")
    proc = subprocess.run([sys.executable, "-c", AVX2_EXACTNESS], env=env, text=True, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    levels, error = proc.stdout.split()
    assert float(error) < 1e-3, error  # float32 rounding of exact int32 sums; a saturated pair is off by >= 1
    if levels == "127":  # an AVX2-only AMD EPYC: torch's int8 product is not oneDNN's, the switch changes nothing
        pytest.skip("ONEDNN_MAX_CPU_ISA does not reach torch._int_mm on this CPU; its 8-bit sums are exact")
    assert levels == "63"


def prepared_model(**overrides):
    model, d = build("convs2s_tiny", vocab=60, **overrides)
    with_random_biases(model).eval()
    model.make_generation_fast_()
    return model, d


def decode_incrementally(model, src_tokens, prev_output_tokens):
    """The logits of every step of incremental decoding (B x T x V), one step at a time."""
    encoder_out = model.encoder(src_tokens, src_lengths=torch.full((len(src_tokens),), src_tokens.size(1)))
    state, steps = {}, []
    for t in range(prev_output_tokens.size(1)):
        logits, _ = model.decoder(prev_output_tokens[:, : t + 1], encoder_out, incremental_state=state)
        steps.append(logits[:, -1])
    return torch.stack(steps, 1)


def test_quantize_replaces_every_linear_layer_of_the_encoder_and_decoder_once():
    model, d = prepared_model()
    weights = {name: m.weight for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    # decoder: fc1, 2 convolutions, 2 x 2 attention, W_o; encoder: fc1, 2 convolutions, fc2
    assert quantize_([model], "int8") == len(weights) == 12
    layers = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert all(isinstance(m, Int8Weights) for m in layers.values())
    assert sum(name.startswith("encoder.") for name in layers) == 4
    assert isinstance(model.decoder.output_projection, Int8OutputProjection)
    assert all(layers[name].weight is weights[name] for name in weights)  # the float32 weights kept, not copied
    assert quantize_([model], "int8") == 0 and quantize_([model], "none") == 0
    with pytest.raises(QuantizeOptionError, match="--quantize takes none or int8"):
        quantize_([model], "int4")


def test_int8_decoding_stays_close_to_float32_and_keeps_a_tied_output_projection():
    """Incremental decoding, step by step, of the int8 decoder against the float32 one (logits
    within 3% in norm, the same best word nearly everywhere: in 90%, in 80% with twice the
    step of fbgemm's 7-bit rows, on this untrained model's close logits); W_o tied to the embeddings
    stays tied (fc2 is not folded then, and is quantized itself)."""
    torch.manual_seed(1)
    for overrides in ({}, {"share_input_output_embed": True}):
        model, d = prepared_model(**overrides)
        src, prev = random_tokens(d, 6, 9), random_tokens(d, 6, 8)
        with torch.no_grad():
            expected = decode_incrementally(model, src, prev)
            quantize_([model], "int8")
            got = decode_incrementally(model, src, prev)
        assert (got - expected).norm() / expected.norm() < 0.03 * COARSER, overrides
        assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 1 - 0.1 * COARSER, overrides
        if overrides:
            assert model.decoder.output_projection.weight is model.decoder.embed.tokens.weight
            assert isinstance(model.decoder.fc2, Int8Linear)


def test_the_attentions_project_the_source_in_int8_close_to_float32():
    """A beam search projects each sentence's source once per attention (keys W_d^T z_j,
    values W_c (z_j + e_j)): in int8 too, within 2% of float32's in norm (keys, values and
    the key bias, -inf at padding as in float32)."""
    torch.manual_seed(3)
    model, d = prepared_model()
    src = random_tokens(d, 6, 9)
    src[:2, :3] = d.pad()  # left-padded sources: padding positions
    encoder_out = model.encoder(src, src_lengths=(src != d.pad()).sum(1))
    with torch.no_grad():
        expected = [a.project_source(encoder_out) for a in model.decoder.attention if a is not None]
        quantize_([model], "int8")
        got = [a.project_source(encoder_out) for a in model.decoder.attention if a is not None]
    attentions = [a for a in model.decoder.attention if a is not None]
    assert all(isinstance(a, Int8Attention) for a in attentions)
    # W_d^T's int8 rows stored as every int8 layer's, rows of output channels: the faster layout
    assert all(a.keys_int8.is_contiguous() for a in attentions)
    for ours, theirs in zip(got, expected):
        for name in ("keys", "values"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert a.shape == b.shape and a.is_contiguous(), name
            assert not torch.equal(a, b), name  # multiplied in int8, not float32
            assert (a - b).norm() / b.norm() < 0.02 * COARSER, name
        assert torch.equal(ours.key_bias.isinf(), theirs.key_bias.isinf())
        assert torch.equal(ours.embedding_keys, theirs.embedding_keys)


def test_int8_multiplies_the_first_convolution_at_every_step_instead_of_looking_it_up():
    """float32 generation looks the first convolution's products up per word seen; int8
    multiplies it at every step, for every hypothesis, in int8 (the lookup was slower than
    the product): and its steps stay close to the float32 lookup's."""
    torch.manual_seed(2)
    model, d = prepared_model()
    src, prev = random_tokens(d, 6, 9), random_tokens(d, 6, 8)
    with torch.no_grad():
        looked_up = decode_incrementally(model, src, prev)
        quantize_([model], "int8")
        rows = []
        model.decoder.convolutions[0].linear.register_forward_hook(
            lambda module, inputs, output: rows.append(output.shape[:-1].numel()))
        got = decode_incrementally(model, src, prev)
    assert isinstance(model.decoder.convolutions[0].linear, Int8Linear)
    assert rows == [6] * prev.size(1)  # every hypothesis at every step: no lookup
    assert (got - looked_up).norm() / looked_up.norm() < 0.03 * COARSER


def test_quantized_before_generation_folds_weight_norm_and_requantizes_a_later_fc2_fold():
    """A model quantized before make_generation_fast_: weight normalization is folded first;
    fc2 folded into the int8 W_o afterwards (the hub's or a task's later call) is quantized
    again, in W_o's new shape."""
    torch.manual_seed(2)
    model, d = build("convs2s_tiny", vocab=60, decoder_out_embed_dim=48)
    with_random_biases(model).eval()
    src, prev = random_tokens(d, 4, 7), random_tokens(d, 4, 6)
    with torch.no_grad():
        expected = decode_incrementally(model, src, prev)
        quantize_([model], "int8")
        assert not any(type(m).__name__.startswith("Parametrized") for m in model.decoder.modules())
        model.make_generation_fast_()
        assert isinstance(model.decoder.fc2, nn.Identity)
        projection = model.decoder.output_projection
        assert projection.weight_int8.shape == (len(d), projection.in_features) == (len(d), 32)
        got = decode_incrementally(model, src, prev)
    assert (got - expected).norm() / expected.norm() < 0.03 * COARSER


def int8_rows(projection, words):
    """W_o's rows of ``words`` as their int8 values times their scales."""
    q, scale = quantize_weight(projection.weight.detach()[words])
    return q.float() * scale[:, None]


def test_int8_output_projection_reuses_its_logits_and_scores_candidates_as_every_word():
    """W_o over the whole vocabulary writes each step's logits into one tensor (the lean step's
    ``reuse_logits``), in int8; over candidate words (vocabulary selection: the batch's, or
    the columns every sentence shares) each candidate's logit is, bit for bit, its int8 logit
    over the whole vocabulary, the rows quantized once for a search's steps; each sentence's
    own words' rows are quantized alike and multiplied by its hypotheses in float32."""
    model, d = prepared_model()
    projection = model.decoder.output_projection
    features = torch.randn(10, 1, projection.in_features)
    candidates = torch.tensor([0, 1, 2, 3, 11, 25, 40])
    expected = F.linear(features, projection.weight, projection.bias).detach()
    quantize_([model], "int8")
    projection = model.decoder.output_projection
    state = {}
    first = projection(features, incremental_state=state, reuse_logits=True)
    second = projection(features[:6], incremental_state=state, reuse_logits=True)
    assert second.data_ptr() == first.data_ptr()  # the same memory, overwritten
    assert (second - expected[:6]).norm() / expected[:6].norm() < 0.02
    every_word = projection(features).detach()
    assert torch.equal(projection(features, candidates).detach(), every_word[..., candidates])
    per_sentence = torch.stack([candidates, torch.tensor([0, 1, 2, 3, 11, 30, -1])])  # 2 sentences x 5 hypotheses
    search = {}
    for step in range(2):
        got = projection(features, per_sentence, incremental_state=search).detach()
        assert torch.equal(got[:, :, :5], every_word[..., candidates[:5]])  # the shared columns (specials, 11), int8
        own = F.linear(features[:5], int8_rows(projection, [25, 40]), projection.bias[[25, 40]]).detach()
        torch.testing.assert_close(got[:5, :, 5:], own, rtol=1e-5, atol=1e-5)  # own words' int8 rows
    own = F.linear(features[5:], int8_rows(projection, [30]), projection.bias[[30]]).detach()
    torch.testing.assert_close(got[5:, :, 5:6], own, rtol=1e-5, atol=1e-5)
    assert got[5:, :, 6].eq(float("-inf")).all()


def test_quantize_refuses_what_it_was_not_measured_on():
    model, _ = prepared_model()
    with pytest.raises(QuantizeOptionError, match="ConvS2S models"):
        quantize_([model.encoder], "int8")
    model.to(torch.bfloat16)
    with pytest.raises(QuantizeOptionError, match="runs float32 models on a CPU.*torch.bfloat16 on cpu"):
        quantize_([model], "int8")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """(prepared folder with BPE, checkpoint folder): convs2s_tiny, 10 updates."""
    work = tmp_path_factory.mktemp("quantize")
    prepared = prepare(data_dir, work, "--bpe-merges", "500")
    train(prepared / "bin", work / "checkpoints", "--task", "convs2s_translation", "--max-update", "10")
    return prepared, work / "checkpoints"


def generate(trained, *options):
    prepared, checkpoints = trained
    return run("fairseq-generate", prepared / "bin", "--user-dir", USER_DIR, "--path",
               checkpoints / "checkpoint_best.pt", "--beam", 5, "--batch-size", 8, "--gen-subset", "test", *options)


def scored(log):
    """{sentence id: (score, hypothesis)} from fairseq-generate's H lines."""
    return {int(m[0]): (m[1], m[2]) for m in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", log, flags=re.M)}


def test_generate_with_int8_translates_every_sentence(trained):
    log = generate(trained, "--task", "convs2s_translation", "--quantize", "int8")
    assert "int8: 12 linear layers of the encoder and decoder multiply in int8" in log
    assert sorted(hypotheses(log)) == list(range(TEST_SENTENCES))
    assert all(hypothesis.strip() for hypothesis in hypotheses(log).values())


def test_generate_without_int8_is_float32_as_before(trained):
    """The default, and --quantize none, translate as fairseq's own task does (the lean step
    finds fairseq's hypotheses and scores): nothing of int8 runs."""
    default = generate(trained, "--task", "convs2s_translation")
    none = generate(trained, "--task", "convs2s_translation", "--quantize", "none")
    stock = generate(trained, "--task", "translation", "--required-batch-size-multiple", 1)  # all 20
    assert "int8" not in default + none
    assert scored(default) == scored(none) == scored(stock)
    assert len(scored(default)) == TEST_SENTENCES


def test_interactive_with_int8_translates_raw_lines(trained):
    prepared, checkpoints = trained
    lines = (prepared.parent / "raw" / "test.en").read_text(encoding="utf-8").splitlines()[:4]
    log = run("fairseq-interactive", prepared / "bin", "--user-dir", USER_DIR, "--task", "convs2s_translation",
              "--path", checkpoints / "checkpoint_best.pt", "--beam", 5, "--quantize", "int8", "-s", "en", "-t", "de",
              "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", prepared / "bpe" / "codes",
              input="\n".join(lines) + "\n")
    assert "int8: 12 linear layers" in log
    assert len(re.findall(r"^H-\d+\t", log, flags=re.M)) == 4


def test_hub_with_int8(trained):
    prepared, checkpoints = trained
    hub = ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared, quantize="int8")
    decoder = hub.models[0].decoder
    assert isinstance(decoder.output_projection, Int8OutputProjection)
    assert isinstance(hub.models[0].encoder.fc2, Int8Weights)
    assert isinstance(decoder.fc2, nn.Identity)  # folded into W_o before quantizing
    translations = hub.translate(["A dog runs through the snow.", "Two men talk."], beam=5)
    assert len(translations) == 2 and all(isinstance(t, str) and t for t in translations)
    with pytest.raises(QuantizeOptionError, match="--quantize takes none or int8, got 'int4'"):
        ConvS2SModel.from_pretrained(checkpoints, data_name_or_path=prepared, quantize="int4")


def test_training_refuses_quantize(trained, tmp_path):
    prepared, _ = trained
    proc = run("fairseq-train", prepared / "bin", "--user-dir", USER_DIR, "--task", "convs2s_translation",
               "--arch", "convs2s_tiny", "--max-tokens", 1000, "--max-update", 1, "--save-dir", tmp_path,
               "--num-workers", 0, "--quantize", "int8", check=False)
    assert proc.returncode != 0
    assert "--quantize is for translating" in proc.stdout
    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_int8_with_bf16_autocast_is_refused(trained):
    from fairseq import tasks
    from omegaconf import OmegaConf

    prepared, _ = trained
    options = {"_name": "convs2s_translation", "data": str(prepared / "bin"), "source_lang": "en", "target_lang": "de",
               "quantize": "int8", "autocast_bf16": "on"}
    with pytest.raises(QuantizeOptionError, match="--quantize int8 and --autocast-bf16 .*choose one"):
        tasks.setup_task(OmegaConf.create(options))
    assert tasks.setup_task(OmegaConf.create(dict(options, autocast_bf16="off"))).cfg.quantize == "int8"
