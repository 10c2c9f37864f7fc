"""A linear layer's product in int8 on a CPU (``--quantize int8``: per-row activations,
per-channel weights; :mod:`fairseq_convs2s_ext.generation.quantization` says what and why).

As torch operations (:func:`int8_linear_torch`) it is seven passes over memory: the rows'
largest |x|, the division, the rounding, the int8 copy, the product (``torch._int_mm``),
then the int32 sums converted, scaled by row and by channel with the bias added; at the
decoder's shapes all but the product took about as long as the product itself (a beam
search's profile, 2 threads, AMD EPYC with VNNI). The kernel in ``int8_linear.cpp`` does the
same in three: each row quantized while in cache, the product, the sums turned into the
output in place; the same numbers, bit for bit. It is compiled on first use
(:mod:`.kernels`) and used after it has matched the torch operations; where it cannot be
had, they do the work.

``torch.ops.convs2s.int8_linear`` is the same product as an operation of torch's, which
``torch.export`` records once per layer (``convs2s-export --quantize int8``) and an exported
program calls: importing this module registers it.
"""
from typing import Optional

import torch

from .kernels import Kernel

TINY = torch.finfo(torch.float32).tiny  # the scale of an all-zero row or channel


@torch.no_grad()  # for generation: rounding has no gradient
def int8_linear(x: torch.Tensor, weight_t: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x (... x in) times int8 weights ``weight_t`` (in x out, per-channel ``scale``) plus
    ``bias``, x quantized per row; ``out``: a contiguous float32 (rows x out) tensor to write
    into, else a new one. The kernel writes the int32 sums into the float32 result's own
    memory and converts them there, element by element (same size, same place), so that the
    step makes no second rows x out tensor."""
    rows = x.reshape(-1, x.size(-1))
    if torch.compiler.is_compiling():  # torch.export: one node of the program (convs2s-export --quantize int8)
        return torch.ops.convs2s.int8_linear(rows, weight_t, scale, bias).view(*x.shape[:-1], -1)
    kernel = KERNEL.load() if x.device.type == "cpu" and x.dtype == torch.float32 else None
    if kernel is None:
        y = int8_linear_torch(rows, weight_t, scale, bias)
        return (y if out is None else out.copy_(y)).view(*x.shape[:-1], -1)
    y = torch.empty(len(rows), weight_t.size(1), dtype=torch.float32, device=x.device) if out is None else out
    return kernel.int8_linear(rows.contiguous(), weight_t, scale, bias, y).view(*x.shape[:-1], -1)


@torch.library.custom_op("convs2s::int8_linear", mutates_args=())
def int8_linear_op(rows: torch.Tensor, weight_t: torch.Tensor, scale: torch.Tensor,
                   bias: torch.Tensor) -> torch.Tensor:
    """:func:`int8_linear` of ``rows`` (m x in) as ``torch.ops.convs2s.int8_linear``
    (``convs2s-serve`` imports this module before it loads a program)."""
    return int8_linear(rows, weight_t, scale, bias)


@int8_linear_op.register_fake
def _(rows, weight_t, scale, bias):
    return rows.new_empty(rows.size(0), weight_t.size(1))


def int8_linear_torch(rows, weight_t, scale, bias):
    """:func:`int8_linear` of ``rows`` (m x in) with torch's operations."""
    # max |x|: the same numbers as vector_norm(x, inf), whose CPU kernel took 8-14x as long at
    # the decoder's shapes (640 x 256, 640 x 768; 2 threads, AMD EPYC)
    row_scale = rows.abs().amax(dim=1, keepdim=True).div(127).clamp(min=TINY)
    p = torch.round(rows / row_scale).to(torch.int8)
    return torch.addcmul(bias, torch._int_mm(p, weight_t).to(torch.float32) * row_scale, scale)


def _mismatch(kernel) -> Optional[str]:
    """The first shape (rows x in -> out) on which the kernel differs from the torch operations
    by a bit, if any: widths around the vector size, an all-zero row, the decoder's shapes."""
    generator = torch.Generator().manual_seed(0)
    for rows, width, out in [(1, 5, 3), (7, 23, 19), (64, 256, 512), (33, 768, 9792)]:
        x = torch.randn(rows, width, generator=generator) * 3
        x[0] = 0
        weight_t = torch.randint(-127, 128, (width, out), generator=generator, dtype=torch.int8)
        scale, bias = torch.rand(out, generator=generator) / 100, torch.randn(out, generator=generator)
        found = kernel.int8_linear(x, weight_t, scale, bias, torch.empty(rows, out))
        if not torch.equal(found, int8_linear_torch(x, weight_t, scale, bias)):
            return f"{rows} x {width} -> {out}"
    return None


KERNEL = Kernel("int8_linear", _mismatch, "torch's operations do its work, more slowly")
