"""int8 inference on a CPU (``--quantize int8``, ``from_pretrained(..., quantize="int8")``):
the decoder's per-step matrix products, and the encoder's, in int8.

Beam search spends most of its time in the decoder's incremental step, once per hypothesis
and step: W_o over the whole vocabulary (at beam 5 and batch 128, 640 rows x 256 x 10k
words, with fc2 folded in), then the small products of fc1, the linearized convolutions and,
outside a beam search's projected sources, the attention's projections. Each of the
decoder's linear layers, and of the encoder's, is replaced here by an int8 one:

- weights per output channel i, symmetric: w_ij ~ s_i q_ij with s_i = max_j |w_ij| / L, where
  L is 127 where oneDNN's int8 product runs with VNNI (or AMX), and 63 where it runs without
  (an Intel CPU held to AVX2): there it adds pairs of products into a saturating int16, which
  7-bit weights cannot overflow (:func:`convs2s_serving.int8_linear.weight_levels` measures
  which); 127 with fbgemm's product (below);
- activations per row m, when they are multiplied (dynamic): x_mj ~ r_m p_mj with
  r_m = max_j |x_mj| / 127 (with fbgemm's product, 7 bits: twice the step);
- y_mi = r_m s_i sum_j p_mj q_ij + b_i, the sum exact in int32.

A row's scale is its own, so a hypothesis whose features are small keeps its precision
beside one whose features are large; the same holds for W_o's rows of rare words. The
encoder's layers (fc1, the convolutions, fc2) are int8 too: it runs once per sentence, not
once per hypothesis and step, but its products are wider (768 -> 512 a source word), and it
took 8-14% of an int8 beam search before; in int8 it encodes test_2016_flickr in 0.27 s
against 0.48 s (2 threads, AMD EPYC with VNNI; z within 0.01 of float32's, whose largest
value is 0.79).

**The kernel, chosen by measurement.** Candidates at the model's shapes, on an ``lscpu``
"AMD EPYC" with 2 cores, AVX512 and AVX512-VNNI (torch 2.13 CPU, one thread, CPU time of the
best of 9 rounds, because other jobs shared the machine: two runs, at load averages 6.5 and
2.4), speed-up over float32 ``F.linear`` (640 x 256 -> 9792; 640 x 768 -> 512;
640 x 256 -> 256; 128 x 256 -> 9792):

- ``torch._int_mm`` (torch's int8 x int8 -> int32 matrix product) with the per-row
  quantization above: 2.5-2.7x, 3.0-3.1x, 1.9-2.2x, 3.8-4.6x;
- ``torch.ops.quantized.linear_dynamic`` with fbgemm, x86 or onednn packed weights:
  2.4-4.3x, 3.1-3.9x, 2.4-3.2x, 2.9-6.5x (onednn's the fastest at W_o's shape, where it
  converts and scales the int32 sums inside its kernel); but it quantizes a call's
  activations with one scale for the whole matrix (a row of small features loses its
  digits), and its weights are ``torch.quantize_per_channel`` tensors, which torch 2.13
  deprecates (it warns so);
- torchao 0.18's ``Int8DynamicActivationInt8WeightConfig`` (the same per-row and
  per-channel scheme): 1.7-2.0x, 1.5x, 0.8-0.9x, 1.9-2.3x, slower than ``torch._int_mm`` at
  every shape (its quantized weights are a tensor subclass, dispatched at each product), and
  a dependency whose import reports failing to load its CUDA extensions on a CPU-only torch;
- ``torch.ops.aten._weight_int8pack_mm`` (int8 weights, float activations): 0.02-0.05x.

So the products are ``torch._int_mm``'s (oneDNN's s8 x s8 -> s32 gemm, as ``ONEDNN_VERBOSE=1``
shows), where it is fast. On an AVX2-only AMD EPYC (2 cores, torch 2.13) it did not reach
oneDNN (``ONEDNN_VERBOSE=1`` printed nothing) and took 36-47x float32's time at W_o's shape,
where fbgemm's ``linear_dynamic`` took 0.7x (1 and 2 threads). There the products are fbgemm's,
each row divided by its largest |x| before it and multiplied by it after, so that the rows
keep scales of their own (:mod:`convs2s_serving.int8_linear`, which measures the two once a
process, :func:`~convs2s_serving.int8_linear.chosen_product`, and says what fbgemm costs).
``torch._int_mm``'s name is private; it is the op torchao and torch's compiler lower int8 products
to, and ``tests/test_quantize.py`` checks its integer results exactly, so a change of it fails
there. The quantization of the rows before it and the conversion of the int32 sums after it
are one C++ kernel (:mod:`convs2s_serving.int8_linear`, the same numbers as torch's seven
operations, bit for bit): on the benchmark's model at equal work (2 threads, AMD EPYC with
VNNI) it took int8 beam search from 354-380 to 400 sentences a second, and as trained from
262-278 to 310-314, with the same translations. Over a whole beam search at equal work (an
untrained ``convs2s_iwslt_de_en`` with random biases, 384 sentences of test_2016_flickr
forced to 16 tokens, beam 5, batch 128, one thread, the same machine, two runs) int8
translated 164-165 sentences per CPU-second against float32's 87-95 (1.73-1.90x).

These figures were taken on a busy machine, and on one CPU: int8 is an option, not a
choice made for the user, and ``python -m bench.serving`` (bench/README.md) measures the
whole translation, ours float32 against int8 and against CTranslate2, on an idle machine
(docs/performance.md: hosts with VNNI, and the same hosts held to AVX2 instructions).

**What reads the weights directly.** Every quantized layer keeps its float32 ``weight`` and
``bias`` (the same parameters, not copies) beside the int8 ones, and only its ``forward``
multiplies in int8. The attention's projections of the source (once per sentence in a beam
search), which read its layers' weights rather than call them, are int8 too
(:class:`Int8Attention`). With vocabulary selection W_o's rows are int8 too: those every
hypothesis is scored against (the batch's candidates, or those every sentence shares: the most
common words, the rest's clusters) quantized once a batch and multiplied by the int8 kernel, and each sentence's own
words' int8 rows multiplied by its hypotheses as they are read. On the benchmark's model with
selection (2 threads, AMD EPYC with VNNI, alternating in one process) the shared rows in int8
took 495.3 sentences a second to 541.6 at equal work and 389.8 to 418.0 as trained; the own
rows in int8 then 514.9-584.8 to 573.9-602.9 and 390.9-430.5 to 415.3-458.8 (three runs).
With every library held to AVX2 on the same host: the shared rows 397.3 to 424.1 and 288.8
to 314.4, the own rows 374.5 to 416.5 and 284.5 to 292.9. W_o tied to the input embeddings
stays tied. The first convolution, which float32 generation looks up
per word seen (``ConvS2SDecoder.first_convolution_looked_up``), is multiplied in int8 at
every step like the others: the lookup (a gather of k rows a hypothesis and their sum) took
longer than the int8 product; without it int8 translated 431 sentences a second against
399 at equal work and 345 against 335 as trained (the benchmark's model, 2 threads, AMD
EPYC with VNNI, alternating; 894 and 943 of 1000 translations the same).

Quantization comes after the weights are final: after loading, after weight normalization
is folded (done here too, if generation's ``make_generation_fast_`` has not) and after fc2
is folded into W_o (a fold after quantization quantizes the folded W_o again). Weights in
other dtypes than float32 and models on other devices than the CPU are refused: the choice
above was measured on a CPU.
"""
import logging

import torch
import torch.nn as nn
from convs2s_serving.int8_linear import (
    KERNEL, TINY, chosen_product, int8_linear, int8_rows_by_sentence, weight_levels,
)
from torch.nn.utils import parametrize

from ..models.convs2s_decoder import ConvS2SDecoder
from ..modules.multistep_attention import MultiStepAttention
from ..modules.output_projection import OutputProjection
from ..modules.scaling import SQRT_HALF

logger = logging.getLogger(__name__)

QUANTIZE_MODES = ("none", "int8")


class QuantizeOptionError(ValueError):
    """``--quantize`` with a value or in a setting it does not support."""


def check_mode(mode: str) -> str:
    if mode not in QUANTIZE_MODES:
        raise QuantizeOptionError(f"--quantize takes {' or '.join(QUANTIZE_MODES)}, got {mode!r}")
    return mode


def quantize_weight(weight: torch.Tensor):
    """(q, s): int8 q (out x in) and float32 s (out) with weight ~ s[:, None] * q, one scale
    per output channel, q within the levels whose products this CPU's int8 product sums
    exactly (:func:`convs2s_serving.int8_linear.weight_levels`: 127, or 63 where oneDNN's
    runs without VNNI)."""
    levels = weight_levels()
    if levels is None:
        raise QuantizeOptionError("--quantize int8: torch's int8 matrix product (torch._int_mm) does not sum "
                                  "exactly on this CPU, not even with 7-bit weights; run without --quantize int8")
    scale = weight.abs().amax(dim=1).div_(levels).clamp_(min=TINY)
    return torch.round(weight / scale[:, None]).to(torch.int8), scale


class Int8Buffers:
    """A module with int8 tensors made from its float32 weights (``int8_buffers``, by
    :func:`quantize_weight`), kept as buffers that checkpoints do not store."""
    int8_buffers = ()

    def set_int8_buffers(self, **tensors):
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor, persistent=False)


class Int8Weights(Int8Buffers):
    """The int8 copy of a linear layer's float32 ``weight``: ``weight_int8`` (out x in, as the
    float32 weight) and ``weight_scale`` (out), as buffers. ``torch._int_mm`` takes the weights
    in x out: it gets their transpose, a view (``transpose``, which the export's list of
    operations holds). Stored so, rows of output channels, they multiplied faster than stored
    in x out (2 threads, Intel Xeon with AVX512-VNNI, and held to AVX2: W_o's 640 x 256 -> 9792
    in 2.5 ms against 3.0, and 10.5 against 15.5 held to AVX2, the decoder's other products
    1.1x as fast held to AVX2; the benchmark's beam search held to AVX2 at 220-227 sentences a
    second against 208-214 at equal work, 207-214 against 187-189 as trained, the same with
    VNNI within its noise, the same translations)."""
    int8_buffers = ("weight_int8", "weight_scale")

    def quantize_(self):
        q, scale = quantize_weight(self.weight.detach())
        self.set_int8_buffers(weight_int8=q, weight_scale=scale)

    def int8_forward(self, x, out=None):
        return int8_linear(x, self.weight_int8.transpose(0, 1), self.weight_scale, self.bias, out)


class Int8Linear(Int8Weights, nn.Linear):
    """An encoder's or decoder's linear layer (fc1, a convolution's linearized weight, an
    attention projection, fc2) multiplying in int8."""

    def forward(self, x):
        return self.int8_forward(x)


class Int8OutputProjection(Int8Weights, OutputProjection):
    """W_o over the whole vocabulary in int8 (the logits written into the one reused tensor
    of ``reuse_logits``, as the float32 layer does); over candidate words (vocabulary
    selection), the rows scored for every hypothesis (the batch's candidates, or the columns
    every sentence shares) in int8 too, quantized once a batch: a word's logit is the one it
    has over the whole vocabulary, bit for bit (its row has the same scale and int8 values,
    its int32 sum is exact). Each sentence's own words' rows are gathered from W_o's int8 rows
    and multiplied by its hypotheses, converted to float32 as they are read
    (:func:`int8_rows_by_sentence`: a product per sentence, which ``torch._int_mm`` does not
    batch)."""

    def own_rows(self, words):
        return self.weight_int8.index_select(0, words), self.weight_scale.index_select(0, words)

    def own_product(self, rows, by_sentence):
        return int8_rows_by_sentence(rows.own_weight, rows.own_scale, rows.own_bias, by_sentence)

    def rows_product(self, features, weight, bias, incremental_state, out=None):
        quantized = None
        if incremental_state is not None:
            quantized = self.get_incremental_state(incremental_state, "int8_rows")
        if quantized is None:
            quantized = quantize_weight(weight)
            if incremental_state is not None:  # the rows are gathered once a batch: so are these
                self.set_incremental_state(incremental_state, "int8_rows", quantized)
        q, scale = quantized
        return int8_linear(features, q.t(), scale, bias, out)

    def every_word(self, features, incremental_state, reuse_logits):
        logits = self.step_logits(features, incremental_state, reuse_logits, "logits", self.out_features)
        if logits is None:
            return self.int8_forward(features)
        return self.int8_forward(features, out=logits).view(*features.shape[:2], -1)

    def fold_(self, linear):
        """fc2 folded in (in float32, :meth:`OutputProjection.fold_`), then quantized again."""
        super().fold_(linear)
        self.quantize_()


class Int8Attention(Int8Buffers, MultiStepAttention):
    """An attention whose projections of the source (once a sentence in a beam search,
    :meth:`~MultiStepAttention.project_source`) multiply in int8 too: the keys W_d^T z_j by
    W_d^T quantized per its rows (``keys_int8``, with fconv's sqrt(0.5) in ``keys_scale``), the
    values by W_c's int8 weights (its layer's), b_c added after their scaling as in float32.
    In float32 they were half the encoder's time of an exported int8 model (a batch of 128
    sentences of 33 tokens, one thread, AMD EPYC with AVX-512 VNNI: 8.7 and 5.0 ms a layer,
    against 1.2 and 0.9 in int8)."""
    int8_buffers = ("keys_int8", "keys_scale", "no_bias")

    @classmethod
    def of(cls, attention: MultiStepAttention) -> "Int8Attention":
        """``attention`` (its projections already int8 layers) as an Int8Attention over the
        same layers; built on the meta device, so that no weight is drawn for it."""
        with torch.device("meta"):
            layer = cls(attention.in_projection.in_features, attention.in_projection.out_features)
        layer.in_projection, layer.out_projection = attention.in_projection, attention.out_projection
        # W_d^T stored as the int8 layers' weights are, rows of output channels (quantizing its
        # transposed view kept that layout: the slower one, and a view torch's packaging remarked on)
        q, scale = quantize_weight(attention.in_projection.weight.detach().t().contiguous())
        layer.set_int8_buffers(keys_int8=q, keys_scale=scale * SQRT_HALF, no_bias=torch.zeros_like(scale))
        return layer

    def project_keys(self, z):
        keys = int8_linear(z, self.keys_int8.transpose(0, 1), self.keys_scale, self.no_bias)
        return keys.transpose(1, 2).contiguous()

    def project_values(self, v):
        projection = self.out_projection
        return int8_linear(v, projection.weight_int8.transpose(0, 1), projection.weight_scale, self.no_bias)


def as_parameter(tensor: torch.Tensor) -> nn.Parameter:
    """``tensor`` itself if a parameter (a tied weight stays tied), else one over its memory
    (weight normalization folded under ``torch.no_grad`` leaves a plain tensor)."""
    return tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, requires_grad=False)


def int8_layer(linear: nn.Linear) -> nn.Linear:
    """``linear`` (its weight normalization folded) as an int8 layer over the same float32
    parameters; built on the meta device, so that no weight is drawn for it."""
    if parametrize.is_parametrized(linear, "weight"):
        parametrize.remove_parametrizations(linear, "weight", leave_parametrized=True)
    cls = Int8OutputProjection if isinstance(linear, OutputProjection) else Int8Linear
    with torch.device("meta"):
        layer = cls(linear.in_features, linear.out_features)
    bias = torch.zeros_like(linear.weight[:, 0]) if linear.bias is None else linear.bias
    layer.weight, layer.bias = as_parameter(linear.weight), as_parameter(bias)
    if isinstance(linear, OutputProjection):
        layer.rest_clusters = linear.rest_clusters
    layer.quantize_()
    return layer


def quantize_(models, mode: str = "int8") -> int:
    """Replace every linear layer of each model's encoder and decoder by its int8 form (``mode`` int8;
    none: nothing). Returns how many layers it replaced; layers already int8 are left as they
    are, so that a hub's generator, built at every call, quantizes once."""
    if check_mode(mode) == "none":
        return 0
    try:
        product = chosen_product()
    except ValueError as e:  # CONVS2S_INT8_PRODUCT set to what this torch does not have
        raise QuantizeOptionError(f"--quantize int8: {e}") from None
    replaced = 0
    for model in models:
        decoder = getattr(model, "decoder", None)
        if not isinstance(decoder, ConvS2SDecoder):
            raise QuantizeOptionError(f"--quantize int8 quantizes ConvS2S models (--arch convs2s_*), "
                                      f"not {type(model).__name__}")
        for parameter in model.parameters():
            if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
                raise QuantizeOptionError(
                    f"--quantize int8 runs float32 models on a CPU, where its int8 products were measured "
                    f"faster; this model is {parameter.dtype} on {parameter.device.type}")
        for part in (model.encoder, decoder):
            for name, module in list(part.named_modules()):
                if isinstance(module, nn.Linear) and not isinstance(module, Int8Weights):
                    parent_name, _, child = name.rpartition(".")
                    setattr(part.get_submodule(parent_name), child, int8_layer(module))
                    replaced += 1
        for i, attention in enumerate(decoder.attention):
            if attention is not None and not isinstance(attention, Int8Attention):
                decoder.attention[i] = Int8Attention.of(attention)
        decoder.look_up_first_convolution = False  # multiplied in int8: faster (see above)
    if replaced:
        KERNEL.load()  # built now, if need be, rather than during the first batch
        logger.info("int8: %d linear layers of the encoder and decoder multiply in int8 (per-channel "
                    "weights, per-row activations; products by %s)", replaced,
                    "torch._int_mm" if product == "int_mm" else "fbgemm")
    return replaced
