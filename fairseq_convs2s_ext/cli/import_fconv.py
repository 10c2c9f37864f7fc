"""``convs2s-import-fconv IN.pt OUT.pt``: a fairseq ``fconv`` checkpoint as a ``convs2s`` one,
which translates identically (the conversion: :mod:`..checkpoints.fconv_import`)."""
import argparse
import sys
from collections.abc import Mapping

from ..checkpoints import CheckpointError
from ..checkpoints.fconv_import import import_fconv


def parser():
    p = argparse.ArgumentParser(
        prog="convs2s-import-fconv",
        description="Convert a fairseq fconv checkpoint into a convs2s checkpoint that translates "
                    'identically (use it with --user-dir "$(convs2s-user-dir)" --task convs2s_translation).',
    )
    p.add_argument("input", metavar="IN.pt", help="fairseq fconv checkpoint")
    p.add_argument("output", metavar="OUT.pt", help="convs2s checkpoint to write (atomically)")
    for side in ("source", "target"):
        p.add_argument(f"--{side}-dict", metavar="DICT",
                       help=f"the {side} dictionary the fconv model was trained with "
                            f"(default: dict.LANG.txt beside IN.pt)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        state = import_fconv(args.input, args.output, args.source_dict, args.target_dict)
    except CheckpointError as e:
        print(f"convs2s-import-fconv: error: {e}", file=sys.stderr)
        return 1
    model = state["args"] if state.get("args") is not None else state["cfg"]["model"]
    get = model.get if isinstance(model, Mapping) else lambda name: getattr(model, name)
    print(f"wrote {args.output}: convs2s with encoder {get('encoder_layers')}, decoder {get('decoder_layers')}, "
          f"attention {get('decoder_attention')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
