"""``convs2s-average-checkpoints``: a checkpoint whose weights are the mean of several.

    convs2s-average-checkpoints --inputs checkpoints/checkpoint9.pt checkpoints/checkpoint10.pt -o averaged.pt
    convs2s-average-checkpoints --inputs checkpoints --num-epoch-checkpoints 5 -o averaged.pt

The average fairseq's ``scripts/average_checkpoints.py`` computes, which the fairseq package
does not install, and which loads checkpoints with torch's ``weights_only`` unpickler without
the configuration classes fairseq stores in them (it fails on ``argparse.Namespace``). Here
the checkpoints load under that unpickler with the plugin's allowed classes
(:mod:`..checkpoints.safe_loading`), through convs2s-import-fconv's ``load_checkpoint``, which
names the file and the problem when one cannot be read. As in fairseq's script, every other entry of the output
(configuration, optimizer state, training progress) is the first checkpoint's, and integer
buffers are floor-divided. The output is written atomically.
"""
import argparse
import os
import re
import sys

EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")
UPDATE_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt$")


def last_checkpoints(folder, count, pattern):
    """The ``count`` checkpoints of ``folder`` with the highest numbers (epoch or update)."""
    numbered = sorted((int(m[1]), name) for name in os.listdir(folder) if (m := pattern.fullmatch(name)))
    if len(numbered) < count:
        raise ValueError(f"{folder}: {len(numbered)} checkpoints of the form {pattern.pattern}, {count} requested")
    return [os.path.join(folder, name) for _, name in numbered[-count:]]


def average_checkpoints(paths):
    """The first checkpoint with its model weights replaced by the mean over ``paths``."""
    import torch

    from .import_fconv import load_checkpoint

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
    except ValueError as e:  # load_checkpoint's ImportFconvError too
        print(f"convs2s-average-checkpoints: error: {e}", file=sys.stderr)
        return 1
    from fairseq.checkpoint_utils import torch_persistent_save

    torch_persistent_save(state, args.output)  # OUTPUT.tmp renamed: complete or not at all
    print(f"wrote {args.output}: the average of {len(paths)} checkpoints: {' '.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
