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
import typing

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
