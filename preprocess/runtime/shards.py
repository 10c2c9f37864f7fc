"""Shards: the finished parts of a step's output that a rerun after a kill reuses.

A stage that writes an output of a pipeline step (:func:`.atomic.run_step`) in parts, each
complete on its own, keeps the finished ones in ``.NAME.shards/`` beside the step's output
NAME (:func:`.atomic.shard_folder`): each under a temporary name renamed when complete, with
``manifest.json``: what the shards are derived from (the step's name, options and inputs'
sha256, the shard size, and whatever else the stage names: its input's sha256, its function)
and the lines and bytes of each finished shard. A rerun reuses the finished shards if the
manifest's origin is the same (``STAGE: resuming: N of M shards already done``) and
computes the others; any difference discards them all (logged as ``not resuming``). The
step removes the folder once its outputs are in place: a stage needs about twice its
output's disk. A kill loses at most the shards being written.

Tokenizing and applying BPE (:func:`.parallel.map_file`), binarizing (:mod:`..stages.binarize`) and
the builtin aligner's decoding (:mod:`..aligner.fastalign`, in :mod:`..stages.align`'s step) shard their
input by :func:`shard_lines` lines (1,000,000, or ``CONVS2S_SHARD_LINES``).
"""
import json
import logging
import os
import shutil
from contextlib import contextmanager
from typing import BinaryIO, Iterator, List, Tuple

from .atomic import StepOutput, atomic_outputs, remove_path, shard_folder
from ..errors import PreprocessError

logger = logging.getLogger(__name__)

# Input lines per shard of a step's output (the environment may say otherwise).
SHARD_VARIABLE = "CONVS2S_SHARD_LINES"
SHARD_LINES = 1_000_000
MANIFEST = "manifest.json"
SHARDS_FORMAT = 1  # of the manifest and the shards: another one is never reused


def shard_lines() -> int:
    """Input lines per shard: ``CONVS2S_SHARD_LINES`` if set, else :data:`SHARD_LINES`."""
    value = os.environ.get(SHARD_VARIABLE, "").strip()
    if not value:
        return SHARD_LINES
    if not value.isdigit() or int(value) < 1:
        raise PreprocessError(f"{SHARD_VARIABLE}={value!r}: give a whole number of lines "
                              f"above 0, or unset it for the default {SHARD_LINES:,}")
    return int(value)


class Shards:
    """The shards of a stage's output in ``folder``: shard ``i`` holds ``sizes[i]`` input
    lines. Made from what ``folder`` holds: its finished shards are kept if its manifest
    says they were derived from ``derived_from`` (JSON values), else the folder is emptied.
    ``stage`` names the stage in the log."""

    def __init__(self, folder: str, derived_from: dict, sizes: List[int], stage: str):
        self.folder, self.sizes = folder, sizes
        derived_from = json.loads(json.dumps({"format": SHARDS_FORMAT, **derived_from}))
        finished = self._finished(derived_from, stage)
        if finished:
            logger.info("%s: resuming: %d of %d shards already done", stage, len(finished),
                        len(sizes))
        self.manifest = {"derived_from": derived_from,
                         "shards": {str(index): entry for index, entry in sorted(finished.items())}}
        os.makedirs(folder, exist_ok=True)
        self._write_manifest()

    def path(self, index: int) -> str:
        return os.path.join(self.folder, f"{index:06d}")

    def entry(self, index: int) -> dict:
        """What the manifest records of a finished shard: its lines, its bytes, and what the
        stage added when writing it."""
        return self.manifest["shards"][str(index)]

    @property
    def todo(self) -> List[int]:
        """The shards to compute, in order."""
        return [index for index in range(len(self.sizes))
                if str(index) not in self.manifest["shards"]]

    @property
    def lines_done(self) -> int:
        return sum(entry["lines"] for entry in self.manifest["shards"].values())

    @contextmanager
    def writing(self, index: int) -> Iterator[Tuple[str, dict]]:
        """(the temporary name to write shard ``index`` under, a dict of what the manifest
        is to record of it besides its lines and bytes): the shard is renamed and recorded
        if the block succeeds."""
        path, entry = self.path(index), {}
        with atomic_outputs([path]) as (temp,):
            yield temp, entry
        self.manifest["shards"][str(index)] = {**entry, "lines": self.sizes[index],
                                               "bytes": os.path.getsize(path)}
        self._write_manifest()

    def join(self, out: BinaryIO) -> None:
        """Append every shard, all finished, to ``out`` in order."""
        for index in range(len(self.sizes)):
            with open(self.path(index), "rb") as shard:
                shutil.copyfileobj(shard, out, 1 << 20)

    def _write_manifest(self) -> None:
        with atomic_outputs([os.path.join(self.folder, MANIFEST)]) as (temp,):
            with open(temp, "w", encoding="utf-8") as f:
                json.dump(self.manifest, f, indent=1, sort_keys=True)

    def _finished(self, derived_from: dict, stage: str) -> dict:
        """{index: entry} of the shards in the folder that a run derived from
        ``derived_from`` finished, with the lines expected; the folder is removed if it
        holds shards derived from anything else."""
        if not os.path.isdir(self.folder):
            return {}
        try:
            with open(os.path.join(self.folder, MANIFEST), encoding="utf-8") as f:
                manifest = json.load(f)
        except (OSError, ValueError):  # none (killed before it was written), or not one
            manifest = None
        recorded = manifest.get("derived_from") if isinstance(manifest, dict) else None
        if not isinstance(recorded, dict) or recorded != derived_from:
            changed = sorted(key for key in derived_from.keys() | (recorded or {}).keys()
                             if (recorded or {}).get(key) != derived_from.get(key))
            logger.info("%s: not resuming: the shards in %s were derived from other %s; "
                        "computing every shard", stage, self.folder,
                        ", ".join(changed) if recorded else "input or options (no manifest)")
            remove_path(self.folder)
            return {}
        finished = {}
        for key, entry in manifest.get("shards", {}).items():
            index = int(key) if key.isdigit() else len(self.sizes)
            path = self.path(index)
            if index < len(self.sizes) and isinstance(entry, dict) \
                    and entry.get("lines") == self.sizes[index] \
                    and os.path.isfile(path) and os.path.getsize(path) == entry.get("bytes"):
                finished[index] = entry
        return finished


def step_folder(step: StepOutput, stage: str) -> str:
    """The shard folder of the running step's output ``step``, for what a stage keeps there
    besides shards of lines (binarizing's dictionaries, the aligner's model): emptied unless
    derived from the step's origin, as shards are."""
    return Shards(shard_folder(step.path), step.derived_from, [], stage).folder
