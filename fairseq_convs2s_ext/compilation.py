"""``--compile``: training and validation run the model under ``torch.compile``.

The model is compiled once, on its first batch, with dynamic shapes: batches of other sizes
and lengths reuse the same compiled code instead of compiling anew (``torch.compile``'s
default would compile a second time at the second shape, then go dynamic). torch's duck
shaping is off while it traces: it would give sizes that happen to be equal in the first
batch (as many sentences as target positions, sources as long as targets) one symbol, and
compile again at the first batch where they differ. Sizes of 0 and 1 are still specialised
by torch, so a batch of one sentence, or of one-token targets, compiles once more. fairseq's
``--required-seq-len-multiple N`` pads lengths to multiples of N, which keeps the shapes few
for ``--compile-mode reduce-overhead`` (CUDA graphs, one per shape). Every batch that
compiled something is logged, with the time it took and the number of graphs so far; the
numbers computed are eager mode's up to rounding (a test checks 1e-5 on the CPU).
Generation is not compiled: its incremental state is Python dicts that change every step.
"""
import contextlib
import logging
import time
import weakref

import torch

logger = logging.getLogger(__name__)

MODES = ("default", "reduce-overhead", "max-autotune")


class CompiledModels:
    """The compiled form of each model a task trains (fairseq hands the task its model at
    every step), made on first use."""

    def __init__(self, mode: str = "default"):
        if mode not in MODES:
            raise ValueError(f"--compile-mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._compiled = weakref.WeakKeyDictionary()

    def __call__(self, model):
        compiled = self._compiled.get(model)
        if compiled is None:
            compiled = torch.compile(model, dynamic=True, mode=self.mode)
            self._compiled[model] = compiled
        return compiled

    @contextlib.contextmanager
    def step(self, sample):
        """Around a step that calls a compiled model: its sizes traced without duck shaping,
        and what compiling took logged, if it compiled anything."""
        import torch.fx.experimental._config as shapes_config

        graphs, start = graphs_compiled(), time.perf_counter()
        with shapes_config.patch(use_duck_shape=False):
            yield
        new = graphs_compiled() - graphs
        if new:
            tokens = sample.get("net_input", {}).get("src_tokens") if sample else None
            shape = "" if tokens is None else f" (source batch {tuple(tokens.shape)})"
            logger.info(f"--compile: {new} graph(s) compiled in {time.perf_counter() - start:.1f} s{shape}; "
                        f"{graphs_compiled()} in all")


def graphs_compiled() -> int:
    """How many graphs torch.compile has made in this process."""
    from torch._dynamo.utils import counters  # imported here: torch._dynamo takes 2 s to import
    return counters["stats"]["unique_graphs"]
