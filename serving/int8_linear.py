"""A linear layer's product in int8 on a CPU (``--quantize int8``: per-row activations,
per-channel weights; :mod:`fairseq_convs2s_ext.generation.quantization` says what and why).

**Two products, one chosen by measurement** (:func:`chosen_product`, once a process):

- ``int_mm``: ``torch._int_mm`` (int8 x int8 -> int32), with the rows quantized to 8 bits
  before it and the sums converted after it by the C++ kernel below. Where oneDNN runs it
  (CPUs with VNNI or AMX, and Intel CPUs without) it was the fastest product measured.
- ``fbgemm``: torch's fbgemm kernel (``torch.ops.quantized.linear_dynamic``, weights packed
  once per tensor). On an AVX2-only AMD EPYC (2 cores, torch 2.13) ``torch._int_mm`` did not
  reach oneDNN and took 36-47x float32's time at W_o's shape (640 x 256 -> 9792), while fbgemm
  took 0.7x float32's, with the per-row scaling: fbgemm quantizes a call's activations with
  one scale, so each row is divided by its own largest |x| first and its results multiplied
  by it after (per-row scales again, for a pass over the output). It quantizes them to 7 bits
  (``reduce_range``, so that AVX2's pair sums in int16 cannot saturate with 8-bit weights),
  half the precision of ``int_mm``'s 8 bits. Its quantized weights are ``torch.qint8``
  tensors, which torch 2.13 deprecates (the warning is silenced where they are made): where
  fbgemm cannot be had, ``int_mm`` does the work.

**A few rows** (up to FEW_ROWS: a sentence's beam, translating one sentence a batch) may take
a third product, ``few_rows``: the C++ kernel's ``int8_few_rows``, with the rows quantized as
``int_mm``'s and the sums made exactly, by VNNI's int8 dot products where the CPU has the
encoding of the kernel's build (AVX-512 VNNI's for torch's AVX512 capability, AVX-VNNI's for
AVX2), else by AVX2's multiply-add of 16-bit pairs: the same numbers as ``int_mm`` where
``torch._int_mm`` sums exactly; each output channel's weights are read once for a few rows,
two channels at a time. Held to AVX2 on an AMD EPYC with both encodings (one thread), AVX-VNNI
took 5 x 768 -> 512 in 18.9 us against the multiply-adds' 25.5, W_o (5 x 256 -> 9792) in 156
against 205. Each shape takes it or the process's
product, whichever measured the faster at that shape (:func:`few_rows_chosen`). On an AVX2-only
AMD EPYC (one thread), where fbgemm's fixed cost dominates a few rows: 5 x 768 -> 512 in 44 us
against fbgemm's 101, 5 x 256 -> 256 in 14 us against 82; at W_o's shape (5 x 256 -> 9792)
the race is close, and the measurement at its first call decides. Outputs are measured in
buckets of OUT_BUCKET (rounded up): W_o's rows of a sentence's candidates (vocabulary
selection, one sentence a batch) are as many as the sentence has, a new number for most
sentences, and a measurement (9-19 ms on that host, one thread) for each would cost a
sentence's translation half its time again. On a host with VNNI, oneDNN's ``torch._int_mm`` multiplied W_o by 5 rows faster than an
earlier version of it (0.28 against 0.39 ms, docs/performance.md).

``fbgemm`` is chosen only where ``torch._int_mm`` measured more than PRODUCT_MARGIN times its
time (a slow fallback, not a close race: so that the choice does not flip from run to run,
and the more precise product is kept where both are fast), or where ``torch._int_mm`` does not
sum exactly. ``CONVS2S_INT8_PRODUCT=int_mm`` or ``fbgemm`` pins it, for a few rows too. A
warning says where the chosen product measured over SLOWER_THAN_FLOAT32 times float32's time.

With ``int_mm``, as torch operations (:func:`int8_linear_torch`) it is seven passes over
memory: the rows' largest |x|, the division, the rounding, the int8 copy, the product
(``torch._int_mm``), then the int32 sums converted, scaled by row and by channel with the
bias added; at the decoder's shapes all but the product took about as long as the product
itself (a beam search's profile, 2 threads, AMD EPYC with VNNI). The kernel in
``int8_linear.cpp`` does the same in three: each row quantized while in cache, the product,
the sums turned into the output in place; the same numbers, bit for bit. It is compiled on
first use (:mod:`.kernels`) and used after it has matched the torch operations; where it
cannot be had, they do the work.

With vocabulary selection, each sentence's own candidate words' rows of W_o are multiplied by
that sentence's hypotheses alone, a product per sentence that ``torch._int_mm`` does not
batch: :func:`int8_rows_by_sentence` (the same C++ file) reads those rows in int8 and converts
them as it reads them, for all of a sentence's hypotheses at once (at the benchmark's shape,
128 sentences x 230 words x 256, beam 5, 2 threads, AMD EPYC with VNNI: 0.52 ms against
float32 ``torch.baddbmm``'s 1.55 ms, which reads four times the bytes; held to AVX2, a whole
beam search with selection translated 416.5 sentences a second against 374.5 at equal work).

``torch.ops.convs2s.int8_linear`` is the same product as an operation of torch's, which
``torch.export`` records once per layer (``convs2s-export --quantize int8``) and an exported
program calls: importing this module registers it. Once the C++ kernel is loaded, it serves
the operation on the CPU itself where the product chosen for the shape is one of its own
(``few_rows``, ``int_mm``), with no Python in the call, and hands the rest to Python.
"""
import contextlib
import functools
import logging
import os
import time
import warnings
from typing import Dict, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .kernels import Kernel

logger = logging.getLogger(__name__)

TINY = torch.finfo(torch.float32).tiny  # the scale of an all-zero row or channel
PRODUCTS = ("int_mm", "fbgemm")
PRODUCT_ENV = "CONVS2S_INT8_PRODUCT"
PRODUCT_MARGIN = 2.0
# The warning that int8 is slower than float32 comes beyond this ratio, not at a close call: a
# busy machine's noise (fbgemm 9.2 ms against float32's 8.7 beside another CPU-heavy job, on a
# host where alone they take 2.7 and 4.6) must not tell a user to drop int8.
SLOWER_THAN_FLOAT32 = 1.25
PROBE_SHAPE = (128, 512, 2048)  # rows x in -> out: about the size of a decoder step's products
FEW_ROWS = 8  # rows that the C++ kernel's int8_few_rows may multiply (a sentence's beam)
FEW_ROWS_MARGIN = 1.25
OUT_BUCKET = 256  # outputs of a few rows' product measured together (few_rows_chosen)


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


def chosen_product() -> str:
    """The int8 product of this process: ``CONVS2S_INT8_PRODUCT`` if set, else measured
    (:func:`probe_products`; the choice and its figures logged), unless
    :func:`take_product_for_levels` took fbgemm instead."""
    return _taken or _measured_or_pinned_product()


_taken: Optional[str] = None  # the product take_product_for_levels took, if it took one
_remembered = False  # whether the C++ operation runs a product chosen in this process (_operation)


def take_product_for_levels(levels: int) -> None:
    """Weights quantized to ``levels`` (an export's ``int8_weight_levels``) are to be multiplied in
    this process: where its measured product, ``torch._int_mm``, does not sum them exactly
    (127 where oneDNN runs without VNNI, which sums up to 63) and fbgemm, which sums them, is
    there, fbgemm becomes the process's product (logged). An export made where the measurement
    chose fbgemm (127) was refused where it chose ``torch._int_mm`` (63): on the same CPU, from
    run to run, wherever the two measure close to PRODUCT_MARGIN (held to AVX2 on one thread,
    2.0-2.4x). A pinned product stays, and so does one the C++ operation already runs: then
    :func:`weight_levels` says the sums are not exact, and the export is refused."""
    global _taken
    exact = weight_levels()
    if (exact is not None and levels <= exact) or os.environ.get(PRODUCT_ENV) or _remembered:
        return
    if fbgemm_available():
        _taken = "fbgemm"
        logger.info("int8 products: fbgemm, which sums weights of %d levels exactly where torch._int_mm "
                    "sums up to %s on this CPU", levels, exact)


@functools.lru_cache(maxsize=None)
def _measured_or_pinned_product() -> str:
    pinned = os.environ.get(PRODUCT_ENV)
    if pinned:
        if pinned not in PRODUCTS or (pinned == "fbgemm" and not fbgemm_available()):
            available = [p for p in PRODUCTS if p != "fbgemm" or fbgemm_available()]
            raise ValueError(f"{PRODUCT_ENV}={pinned!r}: this torch has {' and '.join(available)}; "
                             f"unset it to have the faster measured")
        return pinned
    if not fbgemm_available():
        return "int_mm"
    seconds = probe_products()
    slow = seconds["int_mm"] > PRODUCT_MARGIN * seconds["fbgemm"]
    chosen = "fbgemm" if slow or int_mm_levels() is None else "int_mm"
    logger.info("int8 products: %s (%s x %s -> %s: torch._int_mm %.2f ms, fbgemm %.2f ms, float32 %.2f ms)",
                chosen, *PROBE_SHAPE, *(1e3 * seconds[k] for k in ("int_mm", "fbgemm", "float32")))
    if seconds[chosen] > SLOWER_THAN_FLOAT32 * seconds["float32"]:
        logger.warning("int8 products measured slower than float32's on this CPU (%.2f ms against %.2f): "
                       "run without --quantize int8", 1e3 * seconds[chosen], 1e3 * seconds["float32"])
    return chosen


@functools.lru_cache(maxsize=None)
def probe_products(rounds: int = 3) -> Dict[str, float]:
    """Seconds of each product alone at PROBE_SHAPE (and of float32's ``F.linear``): the best of
    ``rounds``, the three in turn, after a first call each."""
    generator = torch.Generator().manual_seed(0)
    rows, width, out = PROBE_SHAPE
    x, weight = torch.randn(rows, width, generator=generator), torch.randn(out, width, generator=generator)
    q, scale = torch.randint(-127, 128, (out, width), generator=generator, dtype=torch.int8), torch.rand(out) / 100
    p, bias = q[:rows], torch.zeros(out)
    calls = {"int_mm": lambda: torch._int_mm(p, q.t()),
             "fbgemm": lambda: _fbgemm_linear(x, q.t(), scale, bias),
             "float32": lambda: torch.nn.functional.linear(x, weight, bias)}
    return _best_seconds(calls, rounds)


def weight_levels() -> Optional[int]:
    """The largest |q| of int8 weights whose products this process's int8 product
    (:func:`chosen_product`) sums exactly: 127 with fbgemm (its 7-bit activations), else
    :func:`int_mm_levels`."""
    return 127 if chosen_product() == "fbgemm" else int_mm_levels()


def activation_levels() -> float:
    """The levels each row of activations is quantized to on either side of zero: 127 with
    ``torch._int_mm``; with fbgemm 63.5 (7 bits, unsigned, over the row's [-max, max])."""
    return 63.5 if chosen_product() == "fbgemm" else 127.0


@functools.lru_cache(maxsize=None)
def int_mm_levels() -> Optional[int]:
    """The largest |q| of int8 weights q whose products with int8 activations (|p| <= 127)
    ``torch._int_mm`` sums exactly on this CPU: 127 where oneDNN multiplies int8 in one
    instruction (VNNI: measured on AMD EPYC and Intel Xeon CPUs with AVX512-VNNI); 63 where it
    does not (oneDNN held to AVX2, as on an AVX2 CPU), where it shifts the activations to
    unsigned bytes (p + 128, up to 255) and adds each pair of products into a saturating
    int16 (255 x 127 x 2 overflows it; 255 x 63 x 2 does not); None where neither is exact.
    Measured, not assumed from the CPU's flags (``ONEDNN_MAX_CPU_ISA`` can hold oneDNN below
    them): products of the extreme values, at the decoder's shape and at a small one, against
    their exact sums, with the weights in the layers' layout. Weights quantized to these
    levels (``quantize_weight``) give exact int32 sums, bit for bit the same on every CPU for
    the same levels (with 127 levels oneDNN held to AVX2 got 99% of random sums wrong)."""
    generator = torch.Generator().manual_seed(0)
    for levels in (127, 63):
        for rows, width, out in [(640, 256, 512), (3, 40, 7)]:
            p = torch.randint(-127, 128, (rows, width), generator=generator, dtype=torch.int8)
            q = torch.randint(-levels, levels + 1, (out, width), generator=generator, dtype=torch.int8)
            p[0], q[0] = 127, levels  # the largest pairs of products
            if not torch.equal(torch._int_mm(p, q.t()), (p.long() @ q.long().t()).to(torch.int32)):
                break
        else:
            return levels
    return None


def int8_linear(x: torch.Tensor, weight_t: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                out: Optional[torch.Tensor] = None, product: Optional[str] = None) -> torch.Tensor:
    """x (... x in) times int8 weights ``weight_t`` (in x out, per-channel ``scale``) plus
    ``bias``, x quantized per row. oneDNN multiplies faster where ``weight_t`` is the
    transpose of weights stored out x in, as the layers keep them (:class:`Int8Weights
    <fairseq_convs2s_ext.generation.quantization.Int8Weights>`); exports written before they
    were stored so pass weights stored in x out, which this takes too. ``out``: a contiguous
    float32 (rows x out) tensor to write into, else a new one. The kernel writes the int32
    sums into the float32 result's own memory and converts each in its own place (same size),
    so that the step makes no second rows x out tensor. ``product``: ``int_mm``, ``fbgemm`` or
    ``few_rows`` (default: :func:`chosen_product`, or ``few_rows`` for a few rows where
    :func:`few_rows_chosen` measured it the faster)."""
    if torch.is_grad_enabled():  # for generation: rounding has no gradient (a check, cheaper than a decorator)
        with torch.no_grad():
            return int8_linear(x, weight_t, scale, bias, out, product)
    rows = x.reshape(-1, x.size(-1))
    if torch.compiler.is_compiling():  # torch.export: one node of the program (convs2s-export --quantize int8)
        return torch.ops.convs2s.int8_linear(rows, weight_t, scale, bias).view(*x.shape[:-1], -1)
    kernel = _kernel_for(x)
    if product is None:
        product = _product_for(len(rows), weight_t, kernel)
    if product == "few_rows":
        if kernel is None or not weight_t.t().is_contiguous():
            raise ValueError("the few_rows product needs the C++ kernel and weights stored out x in")
        y = torch.empty(len(rows), weight_t.size(1), dtype=torch.float32) if out is None else out
        return kernel.int8_few_rows(rows.contiguous(), weight_t.t(), scale, bias, y).view(*x.shape[:-1], -1)
    if product == "fbgemm":
        return _fbgemm_linear(rows, weight_t, scale, bias, out).view(*x.shape[:-1], -1)
    if kernel is None:
        y = int8_linear_torch(rows, weight_t, scale, bias)
        return (y if out is None else out.copy_(y)).view(*x.shape[:-1], -1)
    y = torch.empty(len(rows), weight_t.size(1), dtype=torch.float32, device=x.device) if out is None else out
    return kernel.int8_linear(rows.contiguous(), weight_t, scale, bias, y).view(*x.shape[:-1], -1)


def bound_product(rows: int, weight_t: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor):
    """:func:`int8_linear` of ``rows`` float32 CPU rows by these weights, as a function of the
    rows and ``out``, the product chosen once: for a search, which multiplies the same weights
    by as many rows at every step. At W_o's 5 rows the choice and checks of each call took 8
    of its 22 us (AMD EPYC, one thread)."""
    kernel = _kernel_for(bias)
    product = _product_for(rows, weight_t, kernel)
    if product == "few_rows":  # chosen only with the kernel and weights stored out x in
        weight = weight_t.t()
        return lambda x, out: kernel.int8_few_rows(x.contiguous(), weight, scale, bias, out)
    return lambda x, out: int8_linear(x, weight_t, scale, bias, out=out, product=product)


def _kernel_for(x: torch.Tensor):
    """The C++ kernel for float32 CPU operands ``x``, if it is had; else None."""
    return KERNEL.load() if x.device.type == "cpu" and x.dtype == torch.float32 else None


def _product_for(rows: int, weight_t: torch.Tensor, kernel) -> str:
    """The product of ``rows`` rows times ``weight_t`` in this process (``kernel``: the C++
    kernel, if it is had): :func:`chosen_product`, or ``few_rows`` where :func:`few_rows_chosen`."""
    product = chosen_product()
    if kernel is not None and rows <= FEW_ROWS and few_rows_chosen(rows, weight_t, product):
        return "few_rows"
    return product


# (rows, in, out, product) -> whether the few_rows product measured faster at that shape
_FEW_ROWS: Dict[tuple, bool] = {}


def few_rows_chosen(rows: int, weight_t: torch.Tensor, product: str) -> bool:
    """Whether a product of ``rows`` rows (at most FEW_ROWS) with ``weight_t`` is the C++
    kernel's ``int8_few_rows`` rather than ``product`` (the process's, :func:`chosen_product`):
    measured once a process for each shape (its first call; random values; the outputs rounded
    up to a multiple of OUT_BUCKET), the best of 3 rounds of each. The kernel is kept unless ``product`` measured FEW_ROWS_MARGIN times
    faster: so that a close race does not flip from run to run, and the more precise product
    (8-bit rows where fbgemm's are 7-bit) is kept where the two are close. Not taken where
    ``CONVS2S_INT8_PRODUCT`` pins the product, nor for weights not stored out x in."""
    if not weight_t.t().is_contiguous():
        return False
    width, out = weight_t.shape
    out = -(-out // OUT_BUCKET) * OUT_BUCKET
    key = (rows, width, out, product)
    if key not in _FEW_ROWS and os.environ.get(PRODUCT_ENV):  # read once a shape, not at every call
        _FEW_ROWS[key] = False
    if key not in _FEW_ROWS:
        kernel = KERNEL.load()
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(rows, width, generator=generator)
        q = torch.randint(-127, 128, (out, width), generator=generator, dtype=torch.int8)
        scale, bias, y = torch.rand(out, generator=generator) / 100, torch.zeros(out), torch.empty(rows, out)
        calls = {"few_rows": lambda: kernel.int8_few_rows(x, q, scale, bias, y),
                 product: lambda: int8_linear(x, q.t(), scale, bias, y, product=product)}
        seconds = _best_seconds(calls, rounds=3)
        # threads that measured a shape at once keep the first one's answer, so that all of them,
        # and the C++ operation that one of them tells (_operation), take the same product
        _FEW_ROWS.setdefault(key, seconds[product] * FEW_ROWS_MARGIN > seconds["few_rows"])
        logger.debug("int8 products of %d x %d -> %d: few_rows %.3f ms, %s %.3f ms", rows, width, out,
                     1e3 * seconds["few_rows"], product, 1e3 * seconds[product])
    return _FEW_ROWS[key]


def _best_seconds(calls, rounds: int) -> Dict[str, float]:
    """Seconds of each call alone: the best of ``rounds``, the calls in turn, after a first call each."""
    best = dict.fromkeys(calls, float("inf"))
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


# fbgemm's packed copies of int8 weights: (their storage, offset, shape, strides) ->
# (a weak reference to the storage, the versions and scales packed, the packed copy)
_PACKED: Dict[tuple, tuple] = {}


@contextlib.contextmanager
def _fbgemm_engine():
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        yield
    finally:
        torch.backends.quantized.engine = engine


def _packed(weight_t: torch.Tensor, scale: torch.Tensor):
    """fbgemm's packed copy of the int8 weights ``weight_t`` (in x out, per-channel ``scale``),
    made on first use and kept while the weights' memory lives (a layer's, a program's, or
    vocabulary selection's rows of a batch); made again if they or their scales changed.

    Weights are known by their memory (storage, offset, shape, strides), not by their tensor:
    a compiled program (:mod:`.compiled`) hands the operation new tensors over its weights
    at every call. A weak reference to the storage keeps its address from being reused while
    the entry lives, and tells when it died. Inference tensors (made under
    ``torch.inference_mode``, as a compiled program's are) keep no version counter: their
    weights are taken as fixed."""
    storage = weight_t.untyped_storage()
    key = (storage._cdata, weight_t.storage_offset(), tuple(weight_t.shape), weight_t.stride())
    state = (_version(weight_t), scale.data_ptr(), _version(scale))
    known = _PACKED.get(key)
    if known is None or known[1] != state:  # a live storage's entry is its own: its address is held
        for stale in [k for k, entry in _PACKED.items() if entry[0].expired()]:
            del _PACKED[stale]
        with warnings.catch_warnings(), _fbgemm_engine():
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
            weight = torch._make_per_channel_quantized_tensor(
                weight_t.t().contiguous(), scale.double(), torch.zeros(len(scale), dtype=torch.long), 0)
            known = _PACKED[key] = StorageWeakRef(storage), state, torch.ops.quantized.linear_prepack(weight, None)
    return known[2]


def _version(tensor: torch.Tensor) -> int:
    """How many times ``tensor``'s memory was changed in place (0 for an inference tensor,
    which does not count)."""
    return 0 if tensor.is_inference() else tensor._version


def _fbgemm_linear(rows, weight_t, scale, bias, out=None):
    """:func:`int8_linear` with fbgemm's product: each row divided by its largest |x| (fbgemm
    quantizes all rows with one scale, and they share it only once they span the same range),
    then multiplied by it with the bias added, in place."""
    r = rows.abs().amax(dim=1, keepdim=True).clamp_(min=TINY)
    y = torch.ops.quantized.linear_dynamic(rows / r, _packed(weight_t, scale), True)
    return torch.addcmul(bias, y, r, out=y if out is None else out)


@torch.no_grad()
def int8_rows_by_sentence(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Each sentence's own int8 rows of weights ``q`` (S x W x in; per row ``scale`` and
    ``bias``, S x W) times its hypotheses ``h`` (S x B x in, float32): S x B x W, the
    weights converted as they are read (W_o's rows of each sentence's own candidate words with
    vocabulary selection: a product per sentence, which ``torch._int_mm`` does not batch)."""
    kernel = _kernel_for(h)
    if kernel is None:
        return int8_rows_by_sentence_torch(q, scale, bias, h)
    return kernel.int8_rows_by_sentence(q.contiguous(), scale.contiguous(), bias.contiguous(), h.contiguous())


def int8_rows_by_sentence_torch(q, scale, bias, h):
    """:func:`int8_rows_by_sentence` with torch's operations (a float32 copy of the weights)."""
    return torch.baddbmm(bias.unsqueeze(1), h, (q.to(h.dtype) * scale.unsqueeze(2)).transpose(1, 2))


def _operation(rows: torch.Tensor, weight_t: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """:func:`int8_linear` of ``rows`` (m x in) as ``torch.ops.convs2s.int8_linear``
    (``convs2s-serve`` imports this module before it loads a program).

    Once the C++ kernel is loaded, it serves the operation on the CPU (:func:`_serve_operation`)
    and hands this the calls it has no product for; this tells it the product chosen where it
    is one of the kernel's, which it then runs for those rows and weights without Python."""
    global _remembered
    kernel = _kernel_for(rows)
    product = _product_for(len(rows), weight_t, kernel)
    if kernel is not None and product in ("few_rows", "int_mm") and rows.dim() == 2:
        _remembered = True
        kernel.remember_product(rows, weight_t, product)
    return int8_linear(rows, weight_t, scale, bias, product=product)


int8_linear_op = torch.library.custom_op("convs2s::int8_linear", _operation, mutates_args=())


@int8_linear_op.register_fake
def _(rows, weight_t, scale, bias):
    return rows.new_empty(rows.size(0), weight_t.size(1))


def int8_linear_torch(rows, weight_t, scale, bias, int_mm=torch._int_mm):
    """:func:`int8_linear` of ``rows`` (m x in) with torch's operations (``int_mm``: the int8
    product, int32 sums)."""
    # max |x|: the same numbers as vector_norm(x, inf), whose CPU kernel took 8-14x as long at
    # the decoder's shapes (640 x 256, 640 x 768; 2 threads, AMD EPYC)
    row_scale = rows.abs().amax(dim=1, keepdim=True).div(127).clamp(min=TINY)
    p = torch.round(rows / row_scale).to(torch.int8)
    return torch.addcmul(bias, int_mm(p, weight_t).to(torch.float32) * row_scale, scale)


def exact_int_mm(p, q):
    """int8 x int8 -> int32 products, summed exactly (in int64)."""
    return (p.long() @ q.long()).to(torch.int32)


def _mismatch(kernel) -> Optional[str]:
    """The first shape on which the kernel differs from the torch operations, if any: for
    int8_linear (rows x in -> out) by a bit (widths around the vector size, an all-zero row,
    the decoder's shapes); for int8_few_rows by a bit from exact sums (every group size of rows,
    widths around the vector size); for int8_rows_by_sentence (S x W x in, B hypotheses) by more than
    float32's rounding of sums in another order (every group size of hypotheses, widths around
    the vector size, a selection's shape)."""
    generator = torch.Generator().manual_seed(0)
    for rows, width, out in [(1, 5, 3), (7, 23, 19), (64, 256, 512), (33, 768, 9792)]:
        x = torch.randn(rows, width, generator=generator) * 3
        x[0] = 0
        weight_t = torch.randint(-127, 128, (out, width), generator=generator, dtype=torch.int8).t()  # as the layers'
        scale, bias = torch.rand(out, generator=generator) / 100, torch.randn(out, generator=generator)
        found = kernel.int8_linear(x, weight_t, scale, bias, torch.empty(rows, out))
        if not torch.equal(found, int8_linear_torch(x, weight_t, scale, bias)):
            return f"{rows} x {width} -> {out}"
    for rows, width, out in [(1, 5, 3), (7, 23, 19), (8, 40, 33), (11, 17, 9), (5, 768, 512)]:
        x = torch.randn(rows, width, generator=generator) * 3
        x[0] = 0
        q = torch.randint(-127, 128, (out, width), generator=generator, dtype=torch.int8)
        q[0] = 127  # the largest products
        scale, bias = torch.rand(out, generator=generator) / 100, torch.randn(out, generator=generator)
        found = kernel.int8_few_rows(x, q, scale, bias, torch.empty(rows, out))
        if not torch.equal(found, int8_linear_torch(x, q.t(), scale, bias, exact_int_mm)):
            return f"{rows} x {width} -> {out}, int8_few_rows"
    for sentences, words, width, beam in [(2, 3, 5, 1), (3, 7, 23, 5), (2, 5, 40, 13), (16, 230, 256, 5)]:
        q = torch.randint(-127, 128, (sentences, words, width), generator=generator, dtype=torch.int8)
        scale = torch.rand(sentences, words, generator=generator) / 100
        bias = torch.randn(sentences, words, generator=generator)
        h = torch.randn(sentences, beam, width, generator=generator)
        found = kernel.int8_rows_by_sentence(q, scale, bias, h)
        expected = int8_rows_by_sentence_torch(q, scale, bias, h)
        bound = 1e-6 * (torch.bmm(h.abs(), (q.abs().float() * scale.unsqueeze(2)).transpose(1, 2)) + 1) * width
        if found.shape != expected.shape or not ((found - expected).abs() <= bound).all():
            return f"{sentences} sentences x {words} rows x {width}, {beam} hypotheses"
    return None


def _serve_operation(kernel) -> None:
    """Hand ``torch.ops.convs2s.int8_linear`` on the CPU to the C++ kernel (which hands back to
    :func:`_operation` what it has no product for). An exported program calls the operation
    for every int8 layer at every step: through Python's dispatch and :func:`int8_linear`,
    90-120 us a call at the decoder's shapes on an AVX2-only AMD EPYC, where the product of a
    beam's five rows itself takes 22-50 us."""
    kernel.serve_operation(_operation)


KERNEL = Kernel("int8_linear", _mismatch, "torch's operations do its work, more slowly", loaded=_serve_operation)
