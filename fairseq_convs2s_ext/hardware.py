"""What each kind of device runs fast: the one place the plugin asks it.

Where two implementations compute the same numbers, the faster one depends on the device
(and the dtype): a CPU pays for every pass over memory, a GPU for every kernel launch. Each
choice below is what was measured faster on that kind of device, with the benchmark section
that measured it (bench/README.md); a device kind not listed gets the CPU's choice, and every
choice can be overridden by an option. ``make gpu-check`` measures the GPU's choices again.
"""
from functools import lru_cache

import torch

# (what, device type) -> the implementation measured faster there.
FASTEST = {
    # label-smoothed cross entropy (criterions.label_smoothed_loss): "blockwise" reads each
    # block of logits once while it is in cache: on an AMD EPYC (2 cores, AVX2), forward and
    # backward over 4000 x 10k fp32 logits took 255 ms against the fused loss's 468 ms (over
    # 4000 x 18k, 1592 against 1400 ms: the blocks no longer fit the cache). On a GPU its
    # dozen kernels per block of 256 rows cost about a fifth of a training step, and fairseq's
    # full-matrix loss, which "fused" equals, trained at 0.97-1.03x fconv against 0.80x
    # ("Figures on an NVIDIA H100 80GB HBM3").
    ("loss", "cpu"): "blockwise",
    ("loss", "cuda"): "fused",
    # beam search (generation.lean_beam_step): the lean step saves CPU work; on the H100
    # fairseq's own step was faster (1.16-1.19x fconv against 1.03-1.12x).
    ("beam step", "cpu"): "lean",
    ("beam step", "cuda"): "stock",
}


def fastest(what: str, device_type: str) -> str:
    """The implementation of ``what`` measured faster on ``device_type`` ("cpu", "cuda", ...)."""
    return FASTEST.get((what, device_type), FASTEST[what, "cpu"])


class Bf16UnsupportedError(RuntimeError):
    """``--autocast-bf16`` asked for on a CPU whose matrix multiplies have no bf16 path."""


@lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether torch's oneDNN runs bf16 matrix multiplies natively on this CPU (AVX512-BF16,
    AMX); elsewhere they are emulated, hundreds of times slower than fp32."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def check_bf16_runs_fast(device_type: str) -> None:
    """Refuse bf16 autocast for a model on a CPU without native bf16 (GPUs are left alone)."""
    if device_type == "cpu" and not cpu_has_native_bf16():
        raise Bf16UnsupportedError(
            f"--autocast-bf16: this CPU has no native bf16 (torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, oneDNN bf16 unsupported), where bf16 "
            f"matrix multiplies run hundreds of times slower than fp32; run without "
            f"--autocast-bf16 (fp32), or on a GPU or a CPU with AVX512-BF16 or AMX"
        )
