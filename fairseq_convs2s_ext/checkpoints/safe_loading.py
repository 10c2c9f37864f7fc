"""Loading fairseq checkpoints on torch >= 2.6 without letting a checkpoint run code.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``, which refuses the
configuration objects that fairseq stores beside the weights (an ``argparse.Namespace``,
omegaconf containers, numpy scalars). Rather than turning that safety off
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` lets a file run arbitrary code), we allow exactly
these plain data classes, so fairseq's own loaders work.

Allowing ``argparse.Namespace`` alone would open a second door: fairseq builds several
model families by passing strings of their stored configuration to ``eval`` (``fconv``,
``fconv_self_att``, ``fconv_lm``: layer specifications and attention flags; many others:
``adaptive_softmax_cutoff`` through ``utils.eval_str_list``). A Namespace whose
``encoder_layers`` is ``"__import__('os').system(...)"`` would run that command as the
model is built. So a stored Namespace is unpickled as :class:`CheckedNamespace`, which
refuses, as the file is read, any string value that Python would do more with than build
a value (:func:`code_in`). That covers fairseq's ``args`` (old checkpoints, the released
fconv models) and ``cfg['model']`` (fairseq stores the configuration of a model without a
dataclass, fconv's among them, as a Namespace there), on every path that reads a
checkpoint with ``torch.load``: fairseq-generate, fairseq-interactive, fairseq-train
``--restore-file``, the hub's ``from_pretrained`` and ``convs2s-import-fconv``.

A configuration stored as plain dicts needs no allowed class: torch loads it without the
plugin too, and fairseq evaluates it on its own paths. :func:`check_config` refuses such
strings where the plugin builds a model (``convs2s_translation``, convs2s-import-fconv).

The plugin's own commands read checkpoints with :func:`load_checkpoint`, which names the file
and the problem when one cannot be read.
"""
import argparse
import ast
import collections
import os
import typing
from collections.abc import Mapping

import numpy
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

from .errors import CheckpointRefused, UnreadableCheckpoint, why_unreadable

# The largest sequence a stored string may build by repetition: [(512, 3)] * 20 is 20.
MAX_REPETITION = 10**6
_CODE_NODES = {
    ast.Call: "calls a function",
    ast.Lambda: "defines a function",
    ast.ListComp: "runs a loop",
    ast.SetComp: "runs a loop",
    ast.DictComp: "runs a loop",
    ast.GeneratorExp: "runs a loop",
    ast.NamedExpr: "assigns a name",
    ast.JoinedStr: "formats objects",
    ast.Await: "awaits",
    ast.Yield: "yields",
    ast.YieldFrom: "yields",
}


def code_in(text: str) -> typing.Optional[str]:
    """Why ``eval(text)`` could do more than build a value, or None if it could not.

    Text that is no Python expression (a path, a word list) cannot run; an expression may
    use literals, names, operators and subscripts, but not calls, function definitions,
    loops, formatting, dunder attributes, powers, or repetitions past MAX_REPETITION.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    repetition = 1
    for node in ast.walk(tree):
        if type(node) in _CODE_NODES:
            return _CODE_NODES[type(node)]
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return f"reads the private attribute {node.attr}"
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            return f"reads {node.id}"
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift)):
            return "raises to a power"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and isinstance(side.value, int):
                    repetition *= max(abs(side.value), 1)
    if repetition > MAX_REPETITION:
        return f"repeats a value {repetition} times"
    return None


def check_config(config, where: str = "configuration") -> None:
    """Raise :class:`CheckpointRefused` if a string anywhere in ``config`` (a Namespace,
    mapping, list or omegaconf container) could run code when fairseq evaluates it."""
    if isinstance(config, str):
        reason = code_in(config)
        if reason:
            raise CheckpointRefused(f"{where} = {config!r} would run code if fairseq evaluated it "
                                    f"(it {reason}); a model configuration holds only values")
        return
    if isinstance(config, argparse.Namespace):
        config = vars(config)
    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=False)
    if isinstance(config, Mapping):
        for key, value in config.items():
            check_config(value, f"{where}.{key}")
    elif isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            check_config(value, f"{where}[{i}]")


class CheckedNamespace(argparse.Namespace):
    """An ``argparse.Namespace`` read from a checkpoint, its strings checked as it is built.

    It pickles as a plain Namespace, so checkpoints written from it (fairseq's, ours) stay
    readable without the plugin.
    """

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots), as pickle allows
            state = state[0]
        check_config(state or {}, where="option")
        self.__dict__.update(state or {})

    def __reduce_ex__(self, protocol):
        return argparse.Namespace, (), dict(vars(self))


SAFE_GLOBALS = [
    (CheckedNamespace, "argparse.Namespace"),
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


def load_checkpoint(path) -> dict:
    """A fairseq checkpoint read with torch's safe unpickler (no code in the file can run), or
    :class:`UnreadableCheckpoint` naming the file and what to do."""
    if not os.path.isfile(path):
        raise UnreadableCheckpoint(f"{path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = why_unreadable(e, path)
        if reason is None:
            raise
        raise UnreadableCheckpoint(reason) from None
    if not isinstance(state, Mapping) or not isinstance(state.get("model"), Mapping):
        raise UnreadableCheckpoint(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return dict(state)
