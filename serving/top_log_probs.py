"""Each hypothesis's log-probabilities at the special symbols and its k best words, in one
read of its logits: a beam step's work over the vocabulary, on a CPU (the plugin's lean beam
step's and ``convs2s-serve``'s).

torch offers it as two operations: ``torch.log_softmax`` reads the hypotheses x V logits
and writes as many log-probabilities, then ``torch.topk`` reads them again and copies each
row into (value, index) pairs before sorting. The kernel in ``top_log_probs.cpp`` takes a
row once into cache, computes its maximum and the sum of exp(x - max) with the functions
torch's own log_softmax calls, in the same order, and keeps the k largest logits as it
reads them again from cache; only the nspecial + k log-probabilities a row needs are
written, the same values, bit for bit, as torch's (bench/README.md as of 86165d7~, "What each lever
bought", times it against torch's two operations).

It is compiled on first use with ``torch.utils.cpp_extension`` (a C++ compiler and ninja),
once per torch version and CPU capability, into torch's extensions folder
(``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``): about 40 s, then a
tenth of a second to load. It is built only for the capabilities whose vectorized code the
torch build runs (AVX2, AVX512), and used only after it has matched ``torch.log_softmax``
and ``torch.topk`` on random rows. Where it cannot be built, loaded or matched, the lean
step uses torch's two operations, with a warning that says why.
"""
import contextlib
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Tuple

import torch

from convs2s_preprocess.runtime.atomic import atomic_file

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("top_log_probs.cpp")
# torch's own flags for the kernels of each capability (cmake/Codegen.cmake), which select
# at::vec's implementation (CPU_CAPABILITY_*) and allow its instructions.
CAPABILITY_FLAGS = {
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
}


def log_softmax_top_k(logits: torch.Tensor, nspecial: int, k: int,
                      not_words: int = 0) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(log-probabilities of the first nspecial columns and of the k best others, best
    first; those k columns)`` of each row of ``logits`` (hypotheses x columns), the values of
    ``torch.log_softmax``; the last ``not_words`` columns count in its normaliser but are not
    words, never among the best. None where the kernel does not apply (not a contiguous
    float32 CPU tensor, or no kernel on this machine): the caller then computes the
    log-probabilities with torch and takes :func:`top_k` of them."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or not logits.is_contiguous():
        return None
    kernel = load()
    if kernel is None:
        return None
    return tuple(kernel.log_softmax_top_k(logits, nspecial, k, logits.size(1) - not_words))


def top_k(log_probs: torch.Tensor, nspecial: int, k: int, not_words: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """What :func:`log_softmax_top_k` returns, from log-probabilities that torch computed."""
    best = log_probs[:, nspecial: log_probs.size(1) - not_words].topk(k, dim=1)
    return torch.cat([log_probs[:, :nspecial], best.values], dim=1), best.indices + nspecial


@functools.cache
def load():
    """The compiled kernel, built on the first call of a process if need be; None where it
    cannot be had (the reason is logged once)."""
    try:
        return _build()
    except Exception as error:  # a compiler's or loader's failure: torch's ops do the work
        reason = " ".join(str(error).split()) or type(error).__name__
        logger.warning("the lean beam step's top_log_probs kernel is not used (%s); torch.log_softmax "
                       "and torch.topk do its work, more slowly", reason[:300])
        return None


def build_directory(capability: str) -> Path:
    """Where the kernel for ``capability`` and this torch and Python is built."""
    version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    name = f"convs2s_top_log_probs_{capability.lower()}_torch{version}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}" / name


def _build():
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in CAPABILITY_FLAGS:
        raise RuntimeError(f"no build for torch's CPU capability {capability}")
    import fcntl  # POSIX: elsewhere the ImportError says why the kernel is not used

    from torch.utils import cpp_extension

    build = build_directory(capability)
    build.mkdir(parents=True, exist_ok=True)
    # torch's own lock (a file that exists while a build runs) outlives a build that was
    # killed, and then makes every later load wait forever. The lock held here is the
    # system's, released with its process: whoever holds it may remove a lock file left over.
    with open(build / "convs2s.lock", "w") as held, _ninja_on_path():
        fcntl.flock(held, fcntl.LOCK_EX)
        (build / "lock").unlink(missing_ok=True)
        source = _source_in(build)
        built = [library.stat().st_mtime for library in build.glob("*.so")]
        if not built or max(built) < source.stat().st_mtime:
            logger.info("compiling the lean beam step's top_log_probs kernel for %s, once (about 40 s)", capability)
        kernel = cpp_extension.load(
            build.name, [str(source)], build_directory=str(build),
            extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off"] + CAPABILITY_FLAGS[capability],
        )
    mismatch = _mismatch(kernel)
    if mismatch:
        raise RuntimeError(f"its values differ from torch.log_softmax's on {mismatch}")
    return kernel


def _source_in(build: Path) -> Path:
    """The kernel's source, copied into ``build`` where it is not there already with the same
    text. ninja rebuilds when a source's path changes, so compiling the package's own file
    would make every install of the plugin (a checkout, a wheel, a second checkout) rebuild
    the kernel the others built; the copy's path is the same for all of them, and changes
    (and so is rebuilt) only with its text."""
    source = build / SOURCE.name
    text = SOURCE.read_bytes()
    if not source.is_file() or source.read_bytes() != text:
        with atomic_file(str(source)) as temp:  # another process may be compiling it too
            Path(temp).write_bytes(text)
    return source


@contextlib.contextmanager
def _ninja_on_path():
    """torch builds with the ``ninja`` found first on PATH: it is made the ``ninja`` package's
    (a dependency), whatever else PATH holds. Two ninjas take turns otherwise (a system one;
    the package's, in the environment's scripts folder, where the environment is activated),
    and as they hash the build command differently (1.11 and 1.13), each rebuilt the kernel
    that the other had built (about 45 s) at every change of turn."""
    path = os.environ.get("PATH")
    with contextlib.suppress(ImportError):
        import ninja

        os.environ["PATH"] = os.pathsep.join(filter(None, [ninja.BIN_DIR, path]))
    try:
        yield
    finally:
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path


def _mismatch(kernel) -> Optional[str]:
    """The first shape (rows x words) on which the kernel differs from torch's two operations
    by a bit, if any: widths around the vector size, a vocabulary selection's and a word
    level's."""
    generator = torch.Generator().manual_seed(0)
    for rows, width, scale, not_words in [(3, 14, 1.0, 0), (5, 23, 4.0, 0), (64, 720, 5.0, 64), (40, 18283, 3.0, 0)]:
        logits = torch.randn(rows, width, generator=generator) * scale
        nspecial, k = 4, min(10, width - 4)
        found = kernel.log_softmax_top_k(logits, nspecial, k, width - not_words)
        expected = top_k(torch.log_softmax(logits, dim=-1), nspecial, k, not_words)
        if not all(map(torch.equal, found, expected)):
            return f"{rows} x {width}"
    return None
