"""A checkpoint whose weights are the mean of several (the command: ``convs2s-average-checkpoints``).

The average fairseq's ``scripts/average_checkpoints.py`` computes, which the fairseq package
does not install, and which loads checkpoints with torch's ``weights_only`` unpickler without
the configuration classes fairseq stores in them (it fails on ``argparse.Namespace``). Here
the checkpoints load under that unpickler with the plugin's allowed classes, through
:func:`.safe_loading.load_checkpoint`, which names the file and the problem when one cannot be
read. As in fairseq's script, every other entry of the output (configuration, optimizer state,
training progress) is the first checkpoint's. Integer buffers (counters, the dictionary
fingerprints) are not averaged: they must be the same in every checkpoint.
"""
import io
import os
import re

import torch

from .safe_loading import load_checkpoint

EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")
UPDATE_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt$")
# What each pattern's checkpoints are called in a message, with the option that selects them.
KINDS = {EPOCH_CHECKPOINT: ("epoch", "--num-epoch-checkpoints"),
         UPDATE_CHECKPOINT: ("update", "--num-update-checkpoints")}


def _numbered(folder, pattern):
    return sorted((int(m[1]), name) for name in os.listdir(folder) if (m := pattern.fullmatch(name)))


def _found(numbered, kind):
    names = [name for _, name in numbered]
    shown = " ".join(names[:3]) + (" ..." if len(names) > 3 else "")
    return f"{len(names)} {kind} checkpoint{'s' if len(names) != 1 else ''} ({shown})" if names else \
        f"no {kind} checkpoints"


def last_checkpoints(folder, count, pattern):
    """The ``count`` checkpoints of ``folder`` with the highest numbers (epoch or update); too
    few is an error that says what the folder holds, and the option for the other kind."""
    numbered = _numbered(folder, pattern)
    if len(numbered) < count:
        kind, _ = KINDS[pattern]
        message = f"{folder}: {count} {kind} checkpoints requested, found {_found(numbered, kind)}"
        for other, (other_kind, option) in KINDS.items():
            if other is not pattern and (others := _numbered(folder, other)):
                message += f"; found {_found(others, other_kind)}: use {option}"
        raise ValueError(message)
    return [os.path.join(folder, name) for _, name in numbered[-count:]]


def average_checkpoints(paths):
    """The first checkpoint with its model weights replaced by the mean over ``paths``."""
    states = [load_checkpoint(path) for path in paths]
    keys = list(states[0]["model"])
    for path, state in zip(paths[1:], states[1:]):
        if list(state["model"]) != keys:
            raise ValueError(f"{path}: its parameters are not those of {paths[0]}: not the same model")
    averaged = {}
    for key in keys:
        tensors = [state["model"][key] for state in states]
        if tensors[0].is_floating_point():
            averaged[key] = (torch.stack([t.float() for t in tensors]).sum(dim=0) / len(tensors)).to(tensors[0].dtype)
        elif all(torch.equal(t, tensors[0]) for t in tensors[1:]):
            averaged[key] = tensors[0]  # counters and dictionary fingerprints: the same in every one
        else:
            raise ValueError(f"{key} differs between the checkpoints ({', '.join(paths)}): they are not "
                             f"the same model trained with the same dictionaries")
    return dict(states[0], model=averaged)


def write_checkpoint(state, path):
    """Write ``state`` to ``path`` complete or not at all: serialized in memory, written to
    ``PATH.tmp``, synced and renamed. A failed write (a full disk) raises its plain ``OSError``
    and leaves no ``PATH.tmp``; fairseq's ``torch_persistent_save`` would log three tracebacks
    first, and torch's zip writer turns the error into a ``RuntimeError`` as it closes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    temp = f"{path}.tmp"
    try:
        with open(temp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
