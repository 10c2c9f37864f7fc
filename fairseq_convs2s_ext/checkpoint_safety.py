"""Loading fairseq checkpoints on torch >= 2.6 without letting a checkpoint run code.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``, which refuses the
configuration objects that fairseq stores beside the weights (an ``argparse.Namespace``,
omegaconf containers, numpy scalars). Rather than turning that safety off
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` lets a file run arbitrary code), we allow exactly
these plain data classes, so fairseq's own loaders work and an untrusted file still cannot
execute anything.
"""
import argparse
import collections
import os
import pickle
import typing
import zipfile
from collections.abc import Mapping

import numpy
import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

SAFE_GLOBALS = [
    argparse.Namespace,
    collections.defaultdict,
    typing.Any,
    DictConfig,
    ListConfig,
    ContainerMetadata,
    Metadata,
    AnyNode,
    BooleanNode,
    EnumNode,
    FloatNode,
    IntegerNode,
    StringNode,
    numpy.dtype,
    (getattr(numpy, "_core", None) or numpy.core).multiarray.scalar,
    *{type(numpy.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")},
]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(SAFE_GLOBALS)


class CheckpointError(ValueError):
    """A file that is not a loadable fairseq checkpoint; the message names it and says why."""


def load_checkpoint(path):
    """Read a fairseq checkpoint with torch's safe unpickler (no code in the file can run)."""
    allow_fairseq_checkpoints()
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(3)
    if magic == b"BZh":
        raise CheckpointError(
            f"{path}: a bzip2 archive, not a checkpoint: extract it (tar xjf) and pass the model .pt inside"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "global" in str(e).lower():
            raise CheckpointError(
                f"{path}: refused by torch's safe unpickler, as it holds objects other than "
                f"tensors and fairseq's configuration: {str(e).splitlines()[0]}"
            ) from None
        raise CheckpointError(f"{path}: not a PyTorch checkpoint, or a corrupt one ({e})") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError, IndexError) as e:
        raise CheckpointError(f"{path}: not a PyTorch checkpoint, or a corrupt one ({type(e).__name__}: {e})") from None
    if not isinstance(state, Mapping) or not isinstance(state.get("model"), Mapping):
        raise CheckpointError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return dict(state)
