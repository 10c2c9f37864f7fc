"""The runtime's C++ kernels for the CPU (:mod:`.top_log_probs`, :mod:`.int8_linear`): each
compiled on first use with ``torch.utils.cpp_extension`` (a C++ compiler and ninja), once per
torch version and CPU capability, into torch's extensions folder (``TORCH_EXTENSIONS_DIR``,
by default ``~/.cache/torch_extensions``): about 40 s, then a tenth of a second to load.

A kernel is built only for the capabilities whose vectorized code the torch build runs
(AVX2, AVX512), with torch's own flags for them, so that the ``at::vec`` functions it calls
are those torch's own kernels run; and it is used only after its results have matched
torch's operations on random inputs. Where it cannot be built, loaded or matched, the caller
uses torch's operations, with a warning that says why.
"""
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Optional

import torch

from convs2s_preprocess.runtime.atomic import atomic_file

logger = logging.getLogger(__name__)

# torch's own flags for the kernels of each capability (cmake/Codegen.cmake), which select
# at::vec's implementation (CPU_CAPABILITY_*) and allow its instructions.
CAPABILITY_FLAGS = {
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
}
_UNLOADED = object()


class Kernel:
    """The kernel compiled from ``<name>.cpp`` beside this module. ``mismatch(kernel)`` names
    the first input on which it differs from torch's operations, or returns None;
    ``fallback`` ends the warning logged where it is not used (what does its work then);
    ``loaded(kernel)``, if given, is called once it has matched, before its first use."""

    def __init__(self, name: str, mismatch: Callable[[object], Optional[str]], fallback: str,
                 loaded: Optional[Callable[[object], None]] = None):
        self.name, self.mismatch, self.fallback, self.loaded = name, mismatch, fallback, loaded
        self.source = Path(__file__).with_name(f"{name}.cpp")
        self._kernel = _UNLOADED

    def load(self):
        """The compiled kernel, built on the first call of a process if need be; None where it
        cannot be had (the reason is logged once)."""
        if self._kernel is _UNLOADED:
            try:
                self._kernel = self._build()
            except Exception as error:  # a compiler's or loader's failure: torch's ops do the work
                reason = " ".join(str(error).split()) or type(error).__name__
                logger.warning("the %s kernel is not used (%s); %s", self.name, reason[:300], self.fallback)
                self._kernel = None
        return self._kernel

    def build_directory(self, capability: str) -> Path:
        """Where the kernel for ``capability`` and this torch and Python is built."""
        version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
        name = f"convs2s_{self.name}_{capability.lower()}_torch{version}"
        root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                      "torch_extensions")
        return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}" / name

    def _build(self):
        capability = torch.backends.cpu.get_cpu_capability()
        if capability not in CAPABILITY_FLAGS:
            raise RuntimeError(f"no build for torch's CPU capability {capability}")
        import fcntl  # POSIX: elsewhere the ImportError says why the kernel is not used

        from torch.utils import cpp_extension

        build = self.build_directory(capability)
        build.mkdir(parents=True, exist_ok=True)
        # torch's own lock (a file that exists while a build runs) outlives a build that was
        # killed, and then makes every later load wait forever. The lock held here is the
        # system's, released with its process: whoever holds it may remove a lock file left over.
        with open(build / "convs2s.lock", "w") as held, _ninja_on_path():
            fcntl.flock(held, fcntl.LOCK_EX)
            (build / "lock").unlink(missing_ok=True)
            source = self._source_in(build)
            built = [library.stat().st_mtime for library in build.glob("*.so")]
            if not built or max(built) < source.stat().st_mtime:
                logger.info("compiling the %s kernel for %s, once (about 40 s)", self.name, capability)
            kernel = cpp_extension.load(
                build.name, [str(source)], build_directory=str(build),
                extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off"] + CAPABILITY_FLAGS[capability],
            )
        mismatch = self.mismatch(kernel)
        if mismatch:
            raise RuntimeError(f"its values differ from torch's on {mismatch}")
        if self.loaded is not None:
            self.loaded(kernel)
        return kernel

    def _source_in(self, build: Path) -> Path:
        """The kernel's source, copied into ``build`` where it is not there already with the
        same text. ninja rebuilds when a source's path changes, so compiling the package's own
        file would make every install of the plugin (a checkout, a wheel, a second checkout)
        rebuild the kernel the others built; the copy's path is the same for all of them, and
        changes (and so is rebuilt) only with its text."""
        source = build / self.source.name
        text = self.source.read_bytes()
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
