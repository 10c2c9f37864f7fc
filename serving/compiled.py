"""The exported programs compiled ahead of time to C++ (``convs2s-serve --compile``,
``ExportedModel(folder, compile=True)``): torch's AOTInductor turns the encoder's and the
decoder step's ``torch.export`` programs into shared libraries that run their operations with
no Python between them. A step of a few hypotheses is mostly that Python: one sentence a
batch (beam 5), an int8 export served 1.75-2.0x the sentences a second compiled, at batches of
128 about as many (docs/performance.md, "Compiled programs on the AMD EPYC with AVX2 only").

The libraries are built from the programs that :mod:`.safe_loading` checked, on this machine,
and kept in a cache folder of the user's own (:func:`cache_folder`), each under a name made of
its program's SHA-256 (of the bytes checked and loaded, read once) and what the code was built for (torch's version, the CPU's instruction
set, the threads): a changed program, torch or machine gets a library of its own. Building
them takes tens of seconds once; later runs load them. A library is code: the folder and the
file must be the user's and writable by nobody else, or they are refused
(:class:`UnsafeCache`); an export folder never brings one (it would run whatever it holds).

A compiled program assumes its inputs laid out as the exporter's examples, contiguous; the
search hands the step expanded views (the first step's windows, one row for a sentence's b
hypotheses), which it would read wrongly without a word: :class:`CompiledProgram` copies
them first. It hands the library its input tensors in a flat list itself, in the order of
torch's pytree, rather than through the package's own call, which reads the programs' input
and output structure again at every call and flattens the inputs with torch's pytree: one
sentence a batch, that took 1.10x the time of a compiled search (AMD EPYC, AVX2 only, one
thread, alternating in one process; docs/performance.md).
"""
import hashlib
import logging
import os
import stat
import sys
import tempfile
import time
import warnings

import torch
from torch.utils import _pytree as pytree

from .safe_loading import CheckedProgram

logger = logging.getLogger(__name__)

CACHE_ENV = "CONVS2S_SERVING_CACHE"


class UnsafeCache(ValueError):
    """A cache folder or library that someone else could have written."""


class CompileFailed(ValueError):
    """AOTInductor could not build a program (no C++ compiler, say)."""


def cache_folder() -> str:
    """``$CONVS2S_SERVING_CACHE``, else ``$XDG_CACHE_HOME/convs2s-serving`` (``~/.cache`` by
    default)."""
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "convs2s-serving")
    return folder


class CompiledProgram:
    """The program of the file ``path`` (``encoder.pt2``, ``step.pt2``), as ``checked``
    (:func:`.safe_loading.load_exported`: the program and its bytes' SHA-256), compiled by
    AOTInductor, called as the program is."""

    def __init__(self, path: str, checked: CheckedProgram):
        name = os.path.splitext(os.path.basename(path))[0]
        library = os.path.join(_own_folder(cache_folder()), f"{name}-{_build_key(checked.sha256)}.pt2")
        if os.path.exists(library):
            _check_own(library)
        else:
            start = time.perf_counter()
            logger.info("compiling %s with AOTInductor into %s (once; tens of seconds)", path, library)
            handle, temp = tempfile.mkstemp(dir=os.path.dirname(library), prefix="partial-", suffix=".pt2")
            os.close(handle)
            try:
                try:
                    with warnings.catch_warnings():  # torch's own remark on its pytree classes, not the user's
                        warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated", category=FutureWarning)
                        torch._inductor.aoti_compile_and_package(checked.program, package_path=temp)
                except Exception as e:  # the compiler's own errors, of many kinds
                    reason = (str(e).strip().splitlines() or [""])[0][:200]
                    raise CompileFailed(f"{path}: torch's AOTInductor could not compile the program "
                                        f"({type(e).__name__}: {reason}); run without --compile") from e
                os.chmod(temp, 0o600)
                os.replace(temp, library)  # whole or not at all, and a racing process's is as good
            finally:
                if os.path.exists(temp):
                    os.unlink(temp)
            logger.info("compiled in %.0f s", time.perf_counter() - start)
        self.library = library
        self.loader = torch._inductor.aoti_load_package(library).loader
        self.output_structure = pytree.treespec_loads(self.loader.get_call_spec()[1])

    def __call__(self, *inputs):
        return pytree.tree_unflatten(self.loader.boxed_run(_flat_tensors(inputs, [])), self.output_structure)


def _flat_tensors(value, flat: list) -> list:
    """``value``'s tensors (in lists and tuples too, depth first, as torch's pytree orders
    them), contiguous, appended to ``flat``; other values are left out, as the package's own
    call leaves them out."""
    if isinstance(value, torch.Tensor):
        flat.append(value.contiguous())
    elif isinstance(value, (list, tuple)):
        for item in value:
            _flat_tensors(item, flat)
    return flat


def _build_key(sha256: str) -> str:
    """The name of a library built from the program of these bytes, here."""
    digest = hashlib.sha256(sha256.encode())
    built_for = (f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, "
                 f"{torch.get_num_threads()} threads, python {sys.version_info[0]}.{sys.version_info[1]}")
    digest.update(built_for.encode())
    return digest.hexdigest()[:40]


def _own_folder(folder: str) -> str:
    """``folder``, made if missing (readable by the user alone), after :func:`_check_own`."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    _check_own(folder)
    return folder


def _check_own(path: str) -> None:
    """Refuse ``path`` unless this user owns it and nobody else may write it."""
    info = os.stat(path)
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise UnsafeCache(f"{path}: owned by another user: a compiled program there could run anyone's code; "
                          f"set {CACHE_ENV} to a folder of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCache(f"{path}: writable by others: a compiled program there could run anyone's code; "
                          f"chmod go-w {path}, or set {CACHE_ENV} to a folder of your own")
