"""Atomic, resumable pipeline steps.

A step writes each output under a temporary name in the same directory
(``.NAME.tmp``) and renames it with ``os.replace`` only once the step has finished, so an
output that exists under its final name is complete. On a rerun a step whose outputs all
exist is skipped; a step that was killed halfway left only temporary files, which are
deleted when the step runs again. Skipping looks at existence only: delete an output to
make its step (and the steps after it) run again.
"""
import logging
import os
import shutil
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from .errors import PreprocessError

logger = logging.getLogger(__name__)


def temp_path(path: str) -> str:
    """The temporary name under which ``path`` is written (same directory, hidden)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.tmp")


def remove_path(path: str) -> None:
    """Delete a file or directory tree; nothing happens if it does not exist."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


@contextmanager
def atomic_outputs(paths: Sequence[str]) -> Iterator[list]:
    """Yield temporary names for ``paths``; move them into place only if the block succeeds.

    Leftovers of an earlier, killed attempt are deleted first. If the block raises (or is
    interrupted), the temporary files are deleted and no output appears.
    """
    temps = [temp_path(path) for path in paths]
    for temp in temps:
        os.makedirs(os.path.dirname(temp), exist_ok=True)
        remove_path(temp)
    try:
        yield temps
    except BaseException:
        for temp in temps:
            remove_path(temp)
        raise
    for path, temp in zip(paths, temps):
        if not os.path.lexists(temp):
            raise RuntimeError(f"step finished without writing {temp} (for {path})")
        if os.path.isdir(path):
            remove_path(path)  # a directory cannot be replaced by rename
        os.replace(temp, path)


def require_input(path: str) -> None:
    """Fail with a clear message if an input corpus is missing or empty."""
    if not os.path.isfile(path):
        raise PreprocessError(f"input file not found: {path}")
    if os.path.getsize(path) == 0:
        raise PreprocessError(
            f"input corpus is empty: {path} (0 bytes). Check the path, or delete the "
            "output of the step that wrote it so that step runs again."
        )


def run_step(name: str, inputs: Sequence[str], outputs: Sequence[str],
             action: Callable[..., object]) -> bool:
    """Run ``action(*temporary_outputs)`` atomically unless every output already exists.

    Returns True if the step ran, False if it was skipped.
    """
    if all(os.path.exists(path) for path in outputs):
        logger.info("%s: skipped, outputs exist: %s", name, ", ".join(outputs))
        return False
    for path in inputs:
        require_input(path)
    logger.info("%s: writing %s", name, ", ".join(outputs))
    with atomic_outputs(outputs) as temps:
        action(*temps)
    return True
