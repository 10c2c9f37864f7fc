"""A fairseq ``fconv`` checkpoint as a ``convs2s`` one (the command: ``convs2s-import-fconv``).

fairseq's ``fconv`` and our ``convs2s`` compute the same function (Gehring et al., 2017), so
a trained fconv model, such as the released WMT'14 En-Fr, WMT'14 En-De and WMT'17 En-De
ones, translates identically with ``--user-dir fairseq_convs2s_ext`` after this import.
The weights map one to one:

- token and position tables: copied (fconv's table of N rows gives ``max_positions`` =
  N - padding_idx - 1, the same usable length as fconv);
- weight-normalized layers: g and v copied; convolution weights go from fconv's
  (k, in, 2d) layout to the paper's linearized W in R^{2d x kd} (column j * in + c for
  window position j). Checkpoints from before fairseq's decoder ``version`` 2 normalized
  the decoder convolutions per kernel position; those, and layers saved with weight
  normalization removed, are folded into W and renormalized per output row
  (the same W up to rounding);
- residual projections: fconv's ``projections`` (None where widths agree) are our
  ``residual_projections`` (an identity there).

Only the returned attention differs: fconv averages it over all decoder layers, we over
the layers that attend. The layer specifications are parsed without ``eval``. The
optimizer state is not carried over (fine-tune with ``--reset-optimizer``). The output is
written atomically: OUT.pt either appears complete or not at all.

The converted checkpoint carries the fingerprints of the dictionaries the fconv model was
trained with (see :mod:`.dictionaries`), so it refuses to translate with other ones. They
are the ones given (``--source-dict``/``--target-dict``), by default ``dict.SRC.txt`` and
``dict.TGT.txt`` beside IN.pt (where fairseq's released models keep them). A configuration
that would run code when fairseq evaluates it is refused (:mod:`.safe_loading`).
"""
import argparse
import copy
import os
from collections.abc import Mapping
from types import SimpleNamespace

import torch

from ..modules import parse_attention, parse_layers
from ..modules.output_projection import FCONV_NAME
from .dictionaries import fingerprint
from .errors import CheckpointError, CheckpointRefused
from .safe_loading import check_config, load_checkpoint

# What fairseq's Dictionary uses; position tables are sized around it.
PADDING_IDX = 1
MODEL_OPTIONS = (
    "dropout", "encoder_embed_dim", "encoder_layers", "decoder_embed_dim", "decoder_layers",
    "decoder_out_embed_dim", "decoder_attention", "share_input_output_embed",
)


class ImportFconvError(CheckpointError):
    """The input cannot be imported; the message names the file and says why."""


def model_config(state, path):
    """The fconv model's options (argparse style), with its architecture's defaults applied."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq.models.fconv import FConvModel

    if state.get("args") is not None:
        source = state["args"]
    elif isinstance(state.get("cfg"), Mapping) and state["cfg"].get("model") is not None:
        source = state["cfg"]["model"]
    else:
        raise ImportFconvError(f"{path}: not a fairseq checkpoint (no 'args' or 'cfg.model' configuration)")
    try:
        check_config(source, "model")  # a Namespace was checked as it was read; dicts were not
    except CheckpointRefused as e:
        raise ImportFconvError(f"{path}: {e}") from None
    options = dict(source) if isinstance(source, Mapping) else dict(vars(source))
    arch = options.get("arch") or options.get("_name")
    if ARCH_MODEL_REGISTRY.get(arch) is not FConvModel:
        raise ImportFconvError(f"{path}: not an fconv checkpoint (architecture {arch!r})")
    if any(".adaptive_softmax." in key for key in state["model"]):
        raise ImportFconvError(f"{path}: fconv with an adaptive softmax is not supported by convs2s")
    args = argparse.Namespace(**options)
    ARCH_CONFIG_REGISTRY[arch](args)  # fills unset options from getattr defaults; evaluates nothing
    return source, args


def _linearize(weight):
    """fconv's convolution layout (k, in, out) -> the paper's (out, k * in), column j * in + c."""
    return weight.permute(2, 0, 1).reshape(weight.size(2), -1)


def _fold(v, g):
    """g * v / ||v||, the norm over every dimension where g has size 1."""
    dims = [i for i in range(v.dim()) if g.dim() == v.dim() and g.size(i) != 1]
    v, g = v.float(), g.float()
    if not dims:
        return v * (g.reshape(()) / v.norm())
    if len(dims) != 1:
        raise ValueError(f"weight norm g of shape {tuple(g.shape)} does not fit v of shape {tuple(v.shape)}")
    others = [i for i in range(v.dim()) if i != dims[0]]
    return v * (g / v.norm(dim=others, keepdim=True))


def _weight_norm_layer(sd, prefix, convolution):
    """Our (g, v) for one fconv layer: copied when normalized per output channel, else refolded."""
    out_dim = 2 if convolution else 0
    if prefix + "weight" in sd:
        w = sd[prefix + "weight"].float()
    else:
        g, v = sd[prefix + "weight_g"], sd[prefix + "weight_v"]
        expected_g = [1] * v.dim()
        expected_g[out_dim] = v.size(out_dim)
        if list(g.shape) == expected_g:
            return (g.reshape(-1, 1), _linearize(v)) if convolution else (g, v)
        w = _fold(v, g)
    if convolution:
        w = _linearize(w)
    return w.norm(dim=1, keepdim=True), w


def _rename(key):
    side, rest = key.split(".", 1)
    for old, new in (("embed_tokens.", "embed.tokens."), ("embed_positions.", "embed.positions."),
                     ("projections.", "residual_projections."), (f"{FCONV_NAME}.", "output_projection.")):
        if rest.startswith(old):
            return f"{side}.{new}{rest[len(old):]}"
    return key


def convert_state_dict(sd, share_input_output_embed=False):
    """fconv's model state dict -> convs2s's (same function, our parameter names and layout)."""
    converted, layers = {}, set()
    for key, value in sd.items():
        if not key.startswith(("encoder.", "decoder.")):
            raise ValueError(f"unexpected entry {key!r}")
        module, name = key.rsplit(".", 1)
        plain_weight = (name == "weight" and ".embed_" not in key
                        and not (key == "decoder.fc3.weight" and share_input_output_embed))
        if name in ("weight_g", "weight_v") or plain_weight:
            layers.add(module + ".")
        elif name in ("version", "_linearized_weight"):
            continue  # fconv bookkeeping, no weights
        elif name == "bias" and ".convolutions." in key:
            converted[module + ".linear.bias"] = value
        else:
            converted[_rename(key)] = value
    for prefix in sorted(layers):
        convolution = ".convolutions." in prefix
        g, v = _weight_norm_layer(sd, prefix, convolution)
        target = _rename(prefix) + ("linear." if convolution else "") + "parametrizations.weight."
        converted[target + "original0"], converted[target + "original1"] = g, v
    return converted


def convs2s_options(args, sd):
    """The convs2s model options equal to fconv's, checked with our safe parser."""
    options = {name: getattr(args, name) for name in MODEL_OPTIONS}
    options["share_input_output_embed"] = bool(options["share_input_output_embed"])
    for side in ("encoder", "decoder"):
        options[f"{side}_layers"] = repr(parse_layers(options[f"{side}_layers"]))
        rows = sd[f"{side}.embed_positions.weight"].size(0)
        options[f"max_{'source' if side == 'encoder' else 'target'}_positions"] = rows - PADDING_IDX - 1
    num_layers = len(parse_layers(options["decoder_layers"]))
    options["decoder_attention"] = repr(parse_attention(options["decoder_attention"], num_layers))
    return options


def _check_against_convs2s(options, converted, source_dictionary, target_dictionary):
    """Build convs2s with these options on the meta device and compare names and shapes."""
    from ..models import ConvS2SModel

    task = SimpleNamespace(source_dictionary=source_dictionary, target_dictionary=target_dictionary)
    with torch.device("meta"):
        model = ConvS2SModel.build_model(argparse.Namespace(**options), task)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in converted.items()}
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [f"{k}: {got[k]} instead of {expected[k]}" for k in expected if k in got and got[k] != expected[k]]
    if problems:
        raise ValueError("its weights do not match its configuration: " + "; ".join(problems[:8]))


def convert_checkpoint(state, source_dictionary, target_dictionary, path="checkpoint"):
    """A convs2s checkpoint (same structure as fairseq's) from a loaded fconv one trained
    with these dictionaries (fairseq Dictionary objects)."""
    source, args = model_config(state, path)
    try:
        options = convs2s_options(args, state["model"])
        converted = convert_state_dict(state["model"], options["share_input_output_embed"])
        converted["encoder.dictionary_fingerprint"] = fingerprint(source_dictionary)
        converted["decoder.dictionary_fingerprint"] = fingerprint(target_dictionary)
        _check_against_convs2s(options, converted, source_dictionary, target_dictionary)
    except (ValueError, KeyError) as e:
        raise ImportFconvError(f"{path}: cannot import this fconv checkpoint: {e}") from None
    options.update(arch="convs2s", _name="convs2s")

    def with_convs2s_options(config):
        if isinstance(config, Mapping):
            config = {k: v for k, v in config.items() if not k.endswith("embed_path")}
            config.update(options)
            return config
        config = copy.copy(config)
        for name in ("encoder_embed_path", "decoder_embed_path"):
            if hasattr(config, name):
                delattr(config, name)
        for name, value in options.items():
            setattr(config, name, value)
        return config

    out = dict(state)
    out["model"] = converted
    if state.get("args") is not None:
        out["args"] = with_convs2s_options(state["args"])
    if isinstance(state.get("cfg"), Mapping) and state["cfg"].get("model") is not None:
        out["cfg"] = dict(state["cfg"], model=with_convs2s_options(source))
    out["last_optimizer_state"] = None  # fconv's parameter order; meaningless for convs2s
    if isinstance(out.get("extra_state"), Mapping):
        out["extra_state"] = {k: v for k, v in out["extra_state"].items() if not k.startswith("ema")}
    return out


def _language(state, side):
    """The checkpoint's source or target language, from its args or task configuration."""
    name = f"{side}_lang"
    for config in (state.get("args"), (state.get("cfg") or {}).get("task")):
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value:
            return value
    return None


def load_dictionary(state, in_path, side, given=None):
    """The dictionary given, else dict.LANG.txt beside the checkpoint."""
    from fairseq.data import Dictionary

    lang = _language(state, side)
    path = given or (lang and os.path.join(os.path.dirname(os.path.abspath(in_path)), f"dict.{lang}.txt"))
    if not path or not os.path.isfile(path):
        raise ImportFconvError(
            f"{in_path}: the {side} dictionary it was trained with is needed "
            f"({'not found: ' + path if path else 'its language is not recorded'}): pass "
            f"--{side}-dict dict.LANG.txt (fairseq's released models ship it beside model.pt)")
    try:
        dictionary = Dictionary.load(path)
    except (ValueError, RuntimeError, UnicodeDecodeError) as e:
        raise ImportFconvError(f"{path}: not a fairseq dictionary ({e})") from None
    dictionary.filename = path
    return dictionary


def import_fconv(in_path, out_path, source_dict=None, target_dict=None):
    if os.path.isfile(in_path) and os.path.exists(out_path) and os.path.samefile(in_path, out_path):
        raise ImportFconvError(f"{out_path}: the output would overwrite the input checkpoint")
    state = load_checkpoint(in_path)
    dictionaries = [load_dictionary(state, in_path, side, given)
                    for side, given in (("source", source_dict), ("target", target_dict))]
    state = convert_checkpoint(state, *dictionaries, path=in_path)
    from fairseq.checkpoint_utils import torch_persistent_save

    torch_persistent_save(state, out_path)  # OUT.pt.tmp renamed: complete or not at all
    return state
