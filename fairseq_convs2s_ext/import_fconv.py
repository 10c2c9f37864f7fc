"""``convs2s-import-fconv IN.pt OUT.pt``: a fairseq ``fconv`` checkpoint as a ``convs2s`` one.

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
"""
import argparse
import copy
import os
import pickle
import sys
import zipfile
from collections.abc import Mapping
from types import SimpleNamespace

import torch
from preprocess.atomic import atomic_outputs

from .checkpoint_safety import allow_fairseq_checkpoints
from .modules import parse_attention, parse_layers

# What fairseq's Dictionary uses; position tables are sized around it.
PADDING_IDX = 1
MODEL_OPTIONS = (
    "dropout", "encoder_embed_dim", "encoder_layers", "decoder_embed_dim", "decoder_layers",
    "decoder_out_embed_dim", "decoder_attention", "share_input_output_embed",
)


class ImportFconvError(ValueError):
    """The input cannot be imported; the message names the file and says why."""


def load_checkpoint(path):
    """Read a checkpoint with torch's safe unpickler (no code in the file can run)."""
    allow_fairseq_checkpoints()
    if not os.path.isfile(path):
        raise ImportFconvError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(3)
    if magic == b"BZh":
        raise ImportFconvError(
            f"{path}: a bzip2 archive, not a checkpoint: extract it (tar xjf) and pass the model .pt inside"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "global" in str(e).lower():
            raise ImportFconvError(
                f"{path}: refused by torch's safe unpickler, as it holds objects other than "
                f"tensors and fairseq's configuration: {str(e).splitlines()[0]}"
            ) from None
        raise ImportFconvError(f"{path}: not a PyTorch checkpoint, or a corrupt one ({e})") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError, IndexError) as e:
        raise ImportFconvError(f"{path}: not a PyTorch checkpoint, or a corrupt one ({type(e).__name__}: {e})") from None
    if not isinstance(state, Mapping) or not isinstance(state.get("model"), Mapping):
        raise ImportFconvError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return dict(state)


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
    return torch._weight_norm(v, g, dims[0])


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
                     ("projections.", "residual_projections.")):
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


def _check_against_convs2s(options, converted):
    """Build convs2s with these options on the meta device and compare names and shapes."""
    from .models import ConvS2SModel

    class Vocabulary:
        def __init__(self, size):
            self.size = size

        def __len__(self):
            return self.size

        def pad(self):
            return PADDING_IDX

    task = SimpleNamespace(
        source_dictionary=Vocabulary(converted["encoder.embed.tokens.weight"].size(0)),
        target_dictionary=Vocabulary(converted["decoder.embed.tokens.weight"].size(0)),
    )
    with torch.device("meta"):
        model = ConvS2SModel.build_model(argparse.Namespace(**options), task)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in converted.items()}
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [f"{k}: {got[k]} instead of {expected[k]}" for k in expected if k in got and got[k] != expected[k]]
    if problems:
        raise ValueError("its weights do not match its configuration: " + "; ".join(problems[:8]))


def convert_checkpoint(state, path="checkpoint"):
    """A convs2s checkpoint (same structure as fairseq's) from a loaded fconv one."""
    source, args = model_config(state, path)
    try:
        options = convs2s_options(args, state["model"])
        converted = convert_state_dict(state["model"], options["share_input_output_embed"])
        _check_against_convs2s(options, converted)
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


def import_fconv(in_path, out_path):
    if os.path.exists(out_path) and os.path.samefile(in_path, out_path):
        raise ImportFconvError(f"{out_path}: the output would overwrite the input checkpoint")
    state = convert_checkpoint(load_checkpoint(in_path), in_path)
    with atomic_outputs([out_path]) as (temp,):  # OUT.pt appears complete or not at all
        torch.save(state, temp)
    return state


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="convs2s-import-fconv",
        description="Convert a fairseq fconv checkpoint into a convs2s checkpoint that translates "
                    "identically (use it with --user-dir fairseq_convs2s_ext).",
    )
    parser.add_argument("input", metavar="IN.pt", help="fairseq fconv checkpoint")
    parser.add_argument("output", metavar="OUT.pt", help="convs2s checkpoint to write (atomically)")
    args = parser.parse_args(argv)
    try:
        state = import_fconv(args.input, args.output)
    except ImportFconvError as e:
        print(f"convs2s-import-fconv: error: {e}", file=sys.stderr)
        return 1
    model = state["args"] if state.get("args") is not None else state["cfg"]["model"]
    get = model.get if isinstance(model, Mapping) else lambda name: getattr(model, name)
    print(f"wrote {args.output}: convs2s with encoder {get('encoder_layers')}, decoder {get('decoder_layers')}, "
          f"attention {get('decoder_attention')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
