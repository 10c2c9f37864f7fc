"""``convs2s-average-checkpoints``: a checkpoint whose weights are the mean of several
(:mod:`..checkpoints.averaging`), written atomically.

    convs2s-average-checkpoints --inputs checkpoints/checkpoint9.pt checkpoints/checkpoint10.pt -o averaged.pt
    convs2s-average-checkpoints --inputs checkpoints --num-epoch-checkpoints 5 -o averaged.pt
"""
import argparse
import os
import sys

from ..checkpoints import CheckpointError
from ..checkpoints.averaging import EPOCH_CHECKPOINT, UPDATE_CHECKPOINT, average_checkpoints, last_checkpoints, \
    write_checkpoint


def parser():
    p = argparse.ArgumentParser(
        prog="convs2s-average-checkpoints",
        description="Average the model weights of several fairseq checkpoints (loaded safely, "
                    "written atomically).")
    p.add_argument("--inputs", nargs="+", required=True,
                   help="checkpoint files, or one folder with --num-epoch-checkpoints or --num-update-checkpoints")
    p.add_argument("-o", "--output", required=True, help="the averaged checkpoint to write")
    last = p.add_mutually_exclusive_group()
    last.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                      help="average the N last epoch checkpoints (checkpointEPOCH.pt) of the folder")
    last.add_argument("--num-update-checkpoints", type=int, metavar="N",
                      help="average the N last update checkpoints (checkpoint_EPOCH_UPDATE.pt) of the folder")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    count = args.num_epoch_checkpoints or args.num_update_checkpoints
    try:
        if count is not None:
            if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
                raise ValueError("--num-epoch-checkpoints and --num-update-checkpoints take one folder as --inputs")
            pattern = EPOCH_CHECKPOINT if args.num_epoch_checkpoints else UPDATE_CHECKPOINT
            paths = last_checkpoints(args.inputs[0], count, pattern)
        elif any(os.path.isdir(path) for path in args.inputs):
            raise ValueError("a folder as --inputs needs --num-epoch-checkpoints N or --num-update-checkpoints N")
        else:
            paths = args.inputs
        state = average_checkpoints(paths)
    except (ValueError, CheckpointError) as e:
        print(f"convs2s-average-checkpoints: error: {e}", file=sys.stderr)
        return 1
    try:
        write_checkpoint(state, args.output)  # OUTPUT.tmp renamed: complete or not at all
    except OSError as e:  # a full disk, a missing folder: one line
        print(f"convs2s-average-checkpoints: error: cannot write {args.output}: {e.strerror}; nothing "
              f"half-written was kept", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: the average of {len(paths)} checkpoints: {' '.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
