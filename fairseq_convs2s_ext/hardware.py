"""What each kind of device runs fast: the one place the plugin asks it.

Where two implementations compute the same numbers, the faster one depends on the device
(and the dtype): a CPU pays for every pass over memory, a GPU for every kernel launch. Each
choice below is what was measured faster on that kind of device, with the benchmark section
that measured it (bench/README.md as of 86165d7~, which git keeps); a device kind not listed
gets the CPU's choice, and every choice can be overridden by an option. ``make gpu-check`` measures the GPU's choices again.
"""
import json
import logging
import os
import platform
import time
from collections import Counter
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from convs2s_preprocess.runtime.atomic import atomic_file
from convs2s_preprocess.runtime.host import cache_folder

logger = logging.getLogger(__name__)

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
    """``--autocast-bf16`` asked for where bf16 was measured slower than fp32."""


class Bf16OptionError(ValueError):
    """``--autocast-bf16`` with a value other than on, off or auto."""


@lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether torch's oneDNN runs bf16 matrix multiplies natively on this CPU (AVX512-BF16,
    AMX); elsewhere they are emulated, hundreds of times slower than fp32."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# bf16 by measurement. Native is not the same as faster: on an Intel Xeon with AVX512_BF16
# and no AMX (where torch reports bf16 supported) a bf16 torch.mm ran at 39 GFLOP/s against
# 65 in fp32, and the demo model trained slower with --autocast-bf16 than without. So a CPU
# gets bf16 autocast only where a short probe measured bf16 matrix multiplies at the model's
# sizes faster than fp32 (by BF16_MARGIN, since bf16 also costs precision); the figures are
# cached per machine (CPU model, torch version, threads) in bf16_cache_file().
BF16_MODES = ("off", "on", "auto")
BF16_MARGIN = 1.1
PROBE_ROWS = 256  # rows of each probed product: a batch's tokens, as the model's linear layers see them
PROBE_SECONDS = 0.1  # per shape, dtype and round, after a first (warm-up) run
PROBE_ROUNDS = 3


def bf16_mode(value) -> str:
    """``--autocast-bf16``'s value as off, on or auto (a config or checkpoint may hold a bool)."""
    text = str(value).strip().lower()
    if text in ("", "none", "false", "off", "no", "0"):
        return "off"
    if text in ("true", "on", "yes", "1"):
        return "on"
    if text == "auto":
        return "auto"
    raise Bf16OptionError(f"--autocast-bf16 takes on, off or auto (a bare --autocast-bf16: on), got {value!r}")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_cache_file() -> str:
    return os.path.join(cache_folder(), "bf16-probe.json")


def model_shapes(model, count: int = 3) -> List[Tuple[int, int]]:
    """The ``count`` (in, out) sizes of ``model``'s linear layers (the convolutions are linear
    layers over windows) that do most of its multiplies."""
    sizes = Counter((m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear))
    ranked = sorted(sizes, key=lambda kn: -sizes[kn] * kn[0] * kn[1])
    return sorted(ranked[:count]) or [(512, 1024)]


def _gflops(a, b, dtype) -> float:
    """GFLOP/s of ``a @ b`` under autocast to ``dtype`` (float32: no autocast), as the model pays
    for it: the casts included."""
    def once():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            torch.mm(a, b)

    start = time.perf_counter()
    once()
    elapsed, runs = time.perf_counter() - start, 1
    if elapsed < PROBE_SECONDS:  # the first run warmed up: time the next ones
        start, runs = time.perf_counter(), 0
        while (elapsed := time.perf_counter() - start) < PROBE_SECONDS:
            once()
            runs += 1
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] * runs / elapsed / 1e9


def probe_bf16(shapes: Sequence[Tuple[int, int]]) -> Dict[str, float]:
    """fp32 and bf16 GFLOP/s over products of PROBE_ROWS x K by K x N, for each (K, N) of
    ``shapes`` (a total over the shapes: the time they take together). Each dtype is timed
    PROBE_ROUNDS times, the two in turn, and its fastest round counts: the figures are
    cached for good, and a round that another program's work slowed (on a busy 2-core
    machine fp32 once measured 0.22 GFLOP/s, a hundredth of its speed) must not decide."""
    generator = torch.Generator().manual_seed(0)
    flops, seconds = 0.0, {"fp32": 0.0, "bf16": 0.0}
    for k, n in shapes:
        a, b = torch.randn(PROBE_ROWS, k, generator=generator), torch.randn(k, n, generator=generator)
        work = 2 * PROBE_ROWS * k * n / 1e9
        flops += work
        best = {"fp32": 0.0, "bf16": 0.0}
        for _ in range(PROBE_ROUNDS):
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                best[name] = max(best[name], _gflops(a, b, dtype))
        for name in seconds:
            seconds[name] += work / best[name]
    return {name: round(flops / t, 2) for name, t in seconds.items()}


def probe_key(shapes: Sequence[Tuple[int, int]]) -> str:
    """The cache's key of :func:`probe_bf16`'s figures: this machine, torch, threads, shapes,
    and the probe's rounds (figures of a probe of one round, which one slowed round could
    decide, are measured again)."""
    return (f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
            f"{list(map(list, shapes))} | best of {PROBE_ROUNDS}")


def measured_bf16(shapes: Sequence[Tuple[int, int]], cache_file: Optional[str] = None) -> Dict[str, float]:
    """:func:`probe_bf16`'s figures for this machine and ``shapes``, from the cache or measured
    and cached (written atomically: a file cut short is never read as figures)."""
    cache_file = cache_file or bf16_cache_file()
    key = probe_key(shapes)
    try:
        with open(cache_file, encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    if isinstance(cached.get(key), dict) and {"fp32", "bf16"} <= set(cached[key]):
        return cached[key]
    cached[key] = probe_bf16(shapes)
    try:
        with atomic_file(cache_file) as temp, open(temp, "w", encoding="utf-8") as f:
            json.dump(cached, f, indent=1)
    except OSError as e:  # a read-only home: measured again next time
        logger.warning("could not cache the bf16 probe's figures in %s: %s", cache_file, e)
    return cached[key]


def decide_bf16(figures: Dict[str, float], margin: float = BF16_MARGIN) -> Tuple[bool, str]:
    """Whether bf16 autocast pays on this CPU, given :func:`measured_bf16`'s figures, and why."""
    fp32, bf16 = figures["fp32"], figures["bf16"]
    faster = bf16 >= margin * fp32
    return faster, (f"bf16 matrix multiplies at the model's sizes ran at {bf16:g} GFLOP/s against {fp32:g} in "
                    f"fp32 on this CPU ({cpu_model()}, {torch.get_num_threads()} threads; oneDNN bf16 "
                    f"{'native' if cpu_has_native_bf16() else 'emulated'}): bf16 "
                    f"{'is' if faster else 'is not'} at least {margin:g}x faster")


def choose_bf16(mode: str, model, cache_file: Optional[str] = None) -> bool:
    """Whether ``model`` runs under bf16 autocast with ``--autocast-bf16 MODE``: off never; on
    where it was measured faster (else refused, with the figures); auto where it was measured
    faster, the choice and its reason logged. A GPU is not probed: on, or auto where torch
    reports bf16 support."""
    mode = bf16_mode(mode)
    if mode == "off":
        return False
    device = next(model.parameters()).device
    if device.type != "cpu":
        use = mode == "on" or (device.type == "cuda" and torch.cuda.is_bf16_supported())
        logger.info("--autocast-bf16 %s: %s on %s", mode, "bf16" if use else "fp32", device)
        return use
    faster, why = decide_bf16(measured_bf16(model_shapes(model), cache_file))
    if mode == "on" and not faster:
        raise Bf16UnsupportedError(f"--autocast-bf16: {why}; run without --autocast-bf16 (fp32), or with "
                                   f"--autocast-bf16 auto, which takes the faster")
    logger.info("--autocast-bf16 %s: %s, because %s", mode, "bf16" if faster else "fp32", why)
    return faster
