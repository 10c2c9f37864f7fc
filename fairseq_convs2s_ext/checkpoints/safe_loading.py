"""Loading fairseq checkpoints on torch >= 2.6 without letting a checkpoint run code.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``, which refuses the
configuration objects that fairseq stores beside the weights (an ``argparse.Namespace``,
omegaconf containers, numpy scalars). Rather than turning that safety off
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` lets a file run arbitrary code), we allow exactly
these plain data classes, so fairseq's own loaders work.

That alone leaves a second door: fairseq builds several model families by passing strings of
their stored configuration to ``eval`` (``fconv``: its layer specifications and attention
flags; many others: ``adaptive_softmax_cutoff`` through ``utils.eval_str_list``, the
optimizers' betas, ...). A configuration whose ``encoder_layers`` is
``"__import__('os').system(...)"`` would run that command as the model is built, whether it
is stored as a Namespace, an omegaconf container or plain dicts, which torch loads without
any allowed class. So every string of a checkpoint's configuration is checked by an
allow-list (:func:`check_config`):

- under a key that fairseq evaluates (:data:`EVALUATED`, read from fairseq 0.12's sources),
  only the literal grammar of :func:`..modules.layer_spec.literal` is accepted (literals,
  lists and tuples joined with ``+`` and repeated ``* N``, bounded in size), and the string
  is rewritten into its expanded literal, so fairseq's ``eval`` only ever reads a literal;
- under any other key, a string that parses as a Python expression is accepted if it is such
  a literal or inert text: names, dotted names, ``-``, ``/``, ``+`` and ``~`` between them
  (paths, language pairs, ``data-bin/wmt14.en-de``), which evaluate to nothing that runs;
- anything else is refused in one line naming the file and the key.

The checks run on every path that reads a checkpoint once the plugin is imported: fairseq's
``checkpoint_utils.load_checkpoint_to_cpu`` (through which fairseq-generate,
fairseq-interactive, fairseq-train's resumption and every hub's ``from_pretrained`` read, with
any ``--task``) is wrapped by :func:`allow_fairseq_checkpoints` to verify the file's
checksums first (:mod:`.integrity`) and check its configuration after; a stored Namespace is
also checked as it is unpickled (:class:`CheckedNamespace`); the plugin's own commands
(averaging, convs2s-import-fconv) read with :func:`load_checkpoint`, which does both.
Wrapping a function of fairseq's is the one change the plugin makes to fairseq at import: no
hook of fairseq's runs before a checkpoint's configuration reaches ``eval``.
"""
import argparse
import ast
import collections
import functools
import os
import typing
from collections.abc import Mapping

import numpy
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

from ..modules.layer_spec import literal
from .errors import CheckpointRefused, UnreadableCheckpoint, why_unreadable
from .integrity import verify_container

# The configuration keys whose strings fairseq 0.12 passes to eval (fairseq's eval(args.X),
# utils.eval_str_list, eval_str_dict and eval_bool; tests/test_checkpoint_attacks.py reads the
# installed fairseq and fails if it evaluates a key not listed here).
EVALUATED = frozenset({
    "encoder_layers", "decoder_layers", "encoder_attention", "decoder_attention", "self_attention",
    "project_input", "gated_attention", "downsample", "pretrained",  # fconv, fconv_self_att, fconv_lm
    "adaptive_softmax_cutoff", "adaptive_input_cutoff", "character_filters",  # lstm, transformer, *_lm
    "adam_betas", "adamax_betas", "adafactor_eps", "lamb_betas",  # optimizers
    "conv_feature_layers", "conv_aggregator_layers", "feature_encoder_spec",  # wav2vec, hubert
    "pipeline_balance", "pipeline_devices", "pipeline_encoder_balance", "pipeline_encoder_devices",
    "pipeline_decoder_balance", "pipeline_decoder_devices",  # pipeline parallelism
    "vggblock_enc_config", "transformer_enc_config", "transformer_dec_config", "conv_dec_config",
    "transformer_context", "transformer_sampling",  # examples' speech recognition
    "left_pad_source", "left_pad_target", "decoder_zero_init", "xformers_att_config", "wer_args",
    "model_overrides",
})
_INERT_OPERATORS = (ast.Add, ast.Sub, ast.Div)
_SHOWN = 80  # characters of a refused string quoted in the message


def _inert(node) -> bool:
    """Whether ``node`` is text that evaluates to nothing that runs: names, dotted names and
    constants between -, /, + and ~ (a path, a language pair), or a tuple or list of them."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return not node.attr.startswith("_") and _inert(node.value)
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _INERT_OPERATORS) and _inert(node.left) and _inert(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)) and _inert(node.operand)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_inert(e) for e in node.elts)
    return False


def checked(text: str, key: str) -> str:
    """``text``, or the expanded literal fairseq may evaluate instead, if the allow-list above
    accepts it under ``key``; else ValueError saying why not."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None  # no Python expression: eval would fail before it ran anything
    if tree is None:
        return text
    if key in EVALUATED:
        value = literal(text)  # ValueError names what is not allowed
        return repr(value) if any(isinstance(n, ast.BinOp) for n in ast.walk(tree)) else text
    try:
        literal(text)
        return text
    except ValueError as e:
        if _inert(tree.body):
            return text
        raise ValueError(f"{e}, nor a name or path") from None


def _refusal(where: str, text: str, reason: str) -> CheckpointRefused:
    shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return CheckpointRefused(f"{where} = {shown!r} is refused ({reason}): a checkpoint's configuration may hold "
                             f"literal values such as '[(512, 3)] * 20', names and paths, nothing that fairseq's "
                             f"eval could run or grow without bound")


def _checked_value(value, key: str, where: str):
    """``value``, checked; a string possibly rewritten, a container checked in place."""
    if isinstance(value, str):
        try:
            return checked(value, key)
        except ValueError as e:
            raise _refusal(where, value, str(e)) from None
    check_config(value, where)
    return value


def check_config(config, where: str = "configuration") -> None:
    """Check every string of ``config`` (a Namespace, an omegaconf container, a mapping or a
    list, nested in any way) by the allow-list above, rewriting accepted specifications into
    their expanded literals in place; raise :class:`CheckpointRefused` naming the first key
    refused."""
    if isinstance(config, argparse.Namespace):
        for key, value in list(vars(config).items()):
            new = _checked_value(value, key, f"{where}.{key}")
            if new is not value:
                setattr(config, key, new)
    elif isinstance(config, DictConfig):
        with read_write(config), open_dict(config):
            for key in list(config.keys()):
                if OmegaConf.is_interpolation(config, key):
                    continue  # "${...}": the value it resolves to is checked where it is stored
                value = config[key]
                new = _checked_value(value, str(key), f"{where}.{key}")
                if new is not value:
                    config[key] = new
    elif isinstance(config, (Mapping, ListConfig, list)):
        mapping = isinstance(config, Mapping)
        for key in list(config.keys()) if mapping else range(len(config)):
            name = str(key) if mapping else where.rsplit(".", 1)[-1].split("[")[0]  # an item's: its list's
            value = config[key]
            new = _checked_value(value, name, f"{where}.{key}" if mapping else f"{where}[{key}]")
            if new is not value:
                config[key] = new
    elif isinstance(config, tuple):
        for i, value in enumerate(config):
            _checked_value(value, where.rsplit(".", 1)[-1], f"{where}[{i}]")


def check_state(state, path: str) -> None:
    """Check the configuration of a loaded checkpoint (fairseq's ``args`` and ``cfg``);
    :class:`CheckpointRefused` names ``path``."""
    if not isinstance(state, Mapping):
        return
    for name in ("args", "cfg"):
        if state.get(name) is not None:
            try:
                check_config(state[name], name)
            except CheckpointRefused as e:
                raise CheckpointRefused(f"{path}: {e}") from None


class CheckedNamespace(argparse.Namespace):
    """An ``argparse.Namespace`` read from a checkpoint, its strings checked as it is built.

    It pickles as a plain Namespace, so checkpoints written from it (fairseq's, ours) stay
    readable without the plugin.
    """

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots), as pickle allows
            state = state[0]
        state = dict(state or {})
        check_config(state, where="option")
        self.__dict__.update(state)

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
    """Let fairseq's checkpoints load under torch's safe unpickler, and have fairseq's loader
    verify each file's checksums and check its configuration (see the module docstring)."""
    torch.serialization.add_safe_globals(SAFE_GLOBALS)
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(load, "checks_checkpoints", False):
        return

    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and os.path.isfile(path):
            verify_container(os.fspath(path))
        try:
            state = load(path, *args, **kwargs)
        except CheckpointRefused as e:  # by CheckedNamespace, as torch unpickled the file
            raise CheckpointRefused(f"{os.fspath(path)}: {e}") from None
        check_state(state, os.fspath(path))
        return state

    load_checkpoint_to_cpu.checks_checkpoints = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def load_checkpoint(path) -> dict:
    """A fairseq checkpoint, its checksums verified and its configuration checked, read with
    torch's safe unpickler (no code in the file can run); or :class:`UnreadableCheckpoint` or
    :class:`CheckpointRefused` naming the file and what to do."""
    if os.path.isdir(path):
        raise UnreadableCheckpoint(f"{path}: a folder, not a checkpoint file: pass a .pt file inside it")
    if not os.path.isfile(path):
        raise UnreadableCheckpoint(f"{path}: no such file")
    verify_container(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = why_unreadable(e, path)
        if reason is None:
            raise
        raise UnreadableCheckpoint(reason) from None
    if not isinstance(state, Mapping) or not isinstance(state.get("model"), Mapping):
        raise UnreadableCheckpoint(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    check_state(state, path)
    return dict(state)
