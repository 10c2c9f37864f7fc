"""Atomic pipeline steps that know what they were built from.

Atomic: a step writes each output under a temporary name in the same directory
(``.NAME.tmp``) and renames it with ``os.replace`` only once the step has finished, so an
output that exists under its final name is complete. A step that was killed halfway left
only temporary files, which are deleted when it runs again.

Built from: beside its first output a step keeps a record, ``.NAME.built-from.json``, of
what it was built from: the sha256 of each input's bytes, the step's options (everything
else that changes the output, tool versions included) and the sha256 of each output. A
directory's fingerprint is the sha256 of each of its files, by relative name. The record is
written under a temporary name with the outputs and renamed after them, once the old
record is deleted, so a record only ever describes complete outputs, and outputs left
without a record by a killed run are never trusted.

A rerun reuses a step only if its record matches: inputs with the recorded contents (their
paths may differ), the same options, and outputs that still have the recorded contents.
Otherwise it logs why, ``NAME: rebuilding: PATH changed`` (or ``options changed: KEY: OLD
-> NEW``, ``PATH modified since it was built``, ``PATH missing``, ``no record of what built
PATH``), and runs again; a step after it then rebuilds if its own inputs came out
different, and is reused if they came out the same. A missing or empty input is an error
before anything is compared.

A step that fails leaves its previous outputs and their record as they were. Nothing is
deleted (a wrong path must not destroy hours of work); the record still says exactly what
those outputs were built from, so a rerun with those inputs and options reuses them and
any other run rebuilds them; and the error names them as left from an earlier run, so they
are never presented as the result of the failed one.

Content decides, but a large corpus is not read again on every rerun: the record also
keeps each file's inode, size, mtime and ctime, and a file whose four are unchanged keeps
its recorded sha256. Any write changes the ctime, which no tool can set back. A file
changed less than ``RECENT_SECONDS`` before it was hashed gets no such entry: a second
write within the same filesystem timestamp tick could leave all four equal.

Shards: a stage inside a step (:func:`preprocess.parallel.map_file`, binarizing) writes its
output in shards that a rerun can reuse (:mod:`preprocess.shards`), in ``.NAME.shards/``
beside the output NAME; :func:`running_step` tells it which step writes which output, and
what the step was built from, which its shards' manifest names. The folders are kept while
the step runs (a step killed in its second file's stage resumes its first file from them)
and removed once the step's outputs are in place, or when a rerun finds the step current.

Not detected: a change in this project's own code; delete an output to rebuild it.
"""
import contextvars
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

from ..errors import PreprocessError, full_disk_reported
from ..textio import count_lines

logger = logging.getLogger(__name__)

RECORD_SUFFIX = ".built-from.json"
SHARDS_SUFFIX = ".shards"
# How long before it is hashed a file must have last changed for its stat to be trusted
# on the next check (filesystem timestamps are coarser than a nanosecond, FAT's 2 s).
RECENT_SECONDS = 2


def temp_path(path: str) -> str:
    """The temporary name under which ``path`` is written (same directory, hidden)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.tmp")


def record_path(outputs: Sequence[str]) -> str:
    """Where the record of the step writing ``outputs`` lives: beside the first one, hidden."""
    directory, name = os.path.split(os.path.abspath(outputs[0]))
    return os.path.join(directory, f".{name}{RECORD_SUFFIX}")


def shard_folder(path: str) -> str:
    """Where the shards of the output ``path`` are kept while its step runs (hidden)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}{SHARDS_SUFFIX}")


class StepOutput(NamedTuple):
    """An output of the step that is running, as :func:`running_step` describes it."""
    path: str  # its final name
    derived_from: dict  # the step's name, options and inputs' sha256: what changes it
    inputs: dict  # {absolute path: sha256} of the step's inputs

    def sha256(self, path: str) -> str:
        """The sha256 of a file's bytes: as recorded if it is one of the step's inputs."""
        return self.inputs.get(os.path.abspath(path)) or fingerprint(path)["files"]["."]["sha256"]


_RUNNING = contextvars.ContextVar("running_step", default=None)


def running_step(temp: str) -> Optional[StepOutput]:
    """The output of the running step (:func:`run_step`) that is being written under the
    temporary name ``temp``; None if ``temp`` is not one."""
    running = _RUNNING.get()
    return running.get(os.path.abspath(temp)) if running else None


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
    interrupted), the temporary files are deleted and no output appears. The outputs are
    renamed in the order given.
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


@contextmanager
def atomic_file(path: str) -> Iterator[str]:
    """Yield a temporary name beside ``path``, unique to this call; rename it to ``path``
    only if the block succeeds, delete it if the block fails. For a file outside a pipeline
    step that several processes may write at once (a cache, a picture): a fixed temporary
    name, as :func:`atomic_outputs` uses for a step's outputs under its lock, would let one
    writer delete or rename another's half-written file."""
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        yield temp
        os.replace(temp, path)
    except BaseException:
        remove_path(temp)
        raise


def require_input(path: str) -> None:
    """Fail with a clear message if an input corpus is missing or empty."""
    if not os.path.isfile(path):
        raise PreprocessError(f"input file not found: {path}")
    if os.path.getsize(path) == 0:
        raise PreprocessError(
            f"input corpus is empty: {path} (0 bytes). Check the path or, if an earlier "
            "step wrote it, that step's input and options."
        )


def _files(path: str) -> list:
    """(name, path) of the file itself (name ".") or of every file under a directory."""
    if not os.path.isdir(path):
        return [(".", path)]
    return sorted((os.path.relpath(os.path.join(root, name), path), os.path.join(root, name))
                  for root, _, names in os.walk(path) for name in names)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(path: str, known: Optional[dict] = None) -> dict:
    """``{"path", "files": {name: {"sha256", "stat"}}}`` of a file or a directory tree.

    ``known`` is an earlier fingerprint of the same path: a file whose stat (inode, size,
    mtime, ctime) is the one recorded there keeps its recorded sha256 instead of being read.
    """
    known_files = known["files"] if known else {}
    recent = time.time_ns() - RECENT_SECONDS * 10**9
    files = {}
    for name, full in _files(path):
        st = os.stat(full)
        stat = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        cached = known_files.get(name)
        if cached and cached["stat"] == stat:
            digest = cached["sha256"]
        else:
            digest = _sha256(full)
        # Every write sets the ctime, so it is never older than the last write.
        files[name] = {"sha256": digest, "stat": stat if st.st_ctime_ns < recent else None}
    return {"path": path, "files": files}


def _contents(print_: dict) -> dict:
    return {name: entry["sha256"] for name, entry in print_["files"].items()}


def _options_changes(recorded: dict, options: dict) -> list:
    """``KEY: OLD -> NEW`` for every option that differs (a missing one is None)."""
    return [f"{key}: {recorded.get(key)!r} -> {options.get(key)!r}"
            for key in sorted(options.keys() | recorded.keys())
            if options.get(key) != recorded.get(key)]


def _read_record(path: str) -> Optional[dict]:
    """The record at ``path``; None if there is none or it is not one (edited by hand)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and \
        {"options", "inputs", "outputs"} <= record.keys() else None


def _write_record(path: str, record: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)


def _input_changes(record: dict, inputs: Sequence[str], prints: list) -> list:
    recorded = record["inputs"]
    if len(recorded) != len(prints):
        return [f"inputs changed: {', '.join(inputs)} (were "
                f"{', '.join(entry['path'] for entry in recorded)})"]
    return [f"{path} changed" if entry["path"] == now["path"] else
            f"{path} differs from {entry['path']}, read last time"
            for path, entry, now in zip(inputs, recorded, prints)
            if _contents(entry) != _contents(now)]


def _output_changes(record: dict, outputs: Sequence[str], names: list) -> tuple:
    """(reasons, fingerprints of the outputs) against the record's outputs."""
    recorded = record["outputs"]
    if [entry["path"] for entry in recorded] != names:
        return [f"outputs changed: {', '.join(outputs)}"], None
    missing = [path for path in outputs if not os.path.lexists(path)]
    if missing:
        return [f"{path} missing" for path in missing], None
    prints = [dict(fingerprint(path, entry), path=name)
              for path, name, entry in zip(outputs, names, recorded)]
    return [f"{path} modified since it was built"
            for path, entry, now in zip(outputs, recorded, prints)
            if _contents(entry) != _contents(now)], prints


def run_step(name: str, inputs: Sequence[str], outputs: Sequence[str],
             action: Callable[..., object], options: Optional[dict] = None) -> bool:
    """Run ``action(*temporary_outputs)`` atomically unless the record says it is current.

    ``options`` are JSON values: whatever, besides the inputs' contents, changes the
    outputs. Returns True if the step ran, False if its outputs were reused. If the step
    fails where outputs of an earlier run exist, the error says that they are left as
    they were and do not match these inputs and options.
    """
    try:
        return _run_step(name, inputs, outputs, action, options)
    except PreprocessError as exc:
        earlier = [path for path in outputs if os.path.lexists(path)]
        if not earlier:
            raise
        raise PreprocessError(f"{exc}\n{name} failed: {', '.join(earlier)} left as an "
                              "earlier run wrote them, not built from these inputs and "
                              "options") from None


def _run_step(name: str, inputs: Sequence[str], outputs: Sequence[str],
              action: Callable[..., object], options: Optional[dict]) -> bool:
    options = json.loads(json.dumps(options or {}))  # as the record will read back
    for path in inputs:
        require_input(path)
    record_file = record_path(outputs)
    names = [os.path.relpath(os.path.abspath(path), os.path.dirname(record_file))
             for path in outputs]
    record = _read_record(record_file)
    known = {entry["path"]: entry for entry in record["inputs"]} if record else {}
    input_prints = [fingerprint(os.path.abspath(path), known.get(os.path.abspath(path)))
                    for path in inputs]
    if record is None:
        existing = [path for path in outputs if os.path.lexists(path)]
        reasons = [f"no record of what built {', '.join(existing)} (written by an older "
                   "version, or by a run killed before it finished)"] if existing else []
    else:
        reasons = _options_changes(record["options"], options)
        reasons = [f"options changed: {', '.join(reasons)}"] if reasons else []
        reasons += _input_changes(record, inputs, input_prints)
        if not reasons:
            reasons, output_prints = _output_changes(record, outputs, names)
        if not reasons:
            logger.info("%s: reused, inputs and options unchanged: %s", name, ", ".join(outputs))
            current = dict(record, inputs=input_prints, outputs=output_prints)
            if current != record:  # new paths or stat entries save work next time
                with full_disk_reported(record_file), atomic_outputs([record_file]) as (temp,):
                    _write_record(temp, current)
            _remove_shards(outputs)  # left by a run killed after its outputs were in place
            return False
    if reasons:
        logger.info("%s: rebuilding: %s", name, "; ".join(reasons))
    else:
        logger.info("%s: writing %s", name, ", ".join(outputs))
    derived_from = {"step": name, "options": options,
                    "inputs": [_contents(print_) for print_ in input_prints]}
    sha256s = {print_["path"]: print_["files"]["."]["sha256"] for print_ in input_prints
               if list(print_["files"]) == ["."]}
    with full_disk_reported(f"{name}: {', '.join(outputs)}"), \
            atomic_outputs([*outputs, record_file]) as temps:
        token = _RUNNING.set({os.path.abspath(temp): StepOutput(path, derived_from, sha256s)
                              for temp, path in zip(temps, outputs)})
        try:
            action(*temps[:-1])
        finally:
            _RUNNING.reset(token)
        _write_record(temps[-1], {
            "step": name, "options": options, "inputs": input_prints,
            "outputs": [dict(fingerprint(temp), path=output)
                        for temp, output in zip(temps, names)],
        })
        # The outputs are about to be replaced: a kill between the renames must not
        # leave the old record describing some of them.
        remove_path(record_file)
    _remove_shards(outputs)
    logger.info("%s: done: %s", name, ", ".join(_size(path) for path in outputs))
    return True


def _remove_shards(outputs: Sequence[str]) -> None:
    for path in outputs:
        remove_path(shard_folder(path))


def _size(path: str) -> str:
    """``path (N lines)``, or ``path/ (N files)`` for a folder: progress a log can show."""
    if os.path.isdir(path):
        return f"{path}/ ({len(os.listdir(path))} files)"
    return f"{path} ({count_lines(path)} lines)"
