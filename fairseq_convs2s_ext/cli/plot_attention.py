"""``convs2s-plot-attention``: the attention of every decoder layer for a sentence pair, drawn
(:mod:`..attention_plot`).

    convs2s-plot-attention --path checkpoints/checkpoint_best.pt --data data \\
        --source "Two dogs play in the snow." --target "Zwei Hunde spielen im Schnee." -o attention/

writes ``attention/layerN.png`` for each decoder layer N that attends and
``attention/average.png`` for their average. Without ``--target`` the model's own translation
(beam search) is drawn. ``--data`` is the folder convs2s-prepare wrote (or its ``bin/``);
sentences are raw text, tokenized and BPE-segmented as prepared.
"""
import argparse
import os
import sys

from ..attention_plot import plot_attention
from ..excepthook import install_excepthook
from ..models.hub_interface import from_pretrained


def parser():
    p = argparse.ArgumentParser(
        prog="convs2s-plot-attention",
        description="Draw the attention of every ConvS2S decoder layer, and their average, for one "
                    "sentence pair: a PNG heatmap each, source tokens on the x axis, target tokens on the y axis.")
    p.add_argument("--path", required=True, help="checkpoint file (fairseq-train's checkpoint_best.pt, ...)")
    p.add_argument("--data", required=True, help="the folder convs2s-prepare wrote, or its bin/ (dictionaries, BPE codes)")
    p.add_argument("--source", required=True, help="source sentence, raw text")
    p.add_argument("--target", help="target sentence, raw text (forced decoding); default: the model's own translation")
    p.add_argument("--beam", type=int, default=5, help="beam size for the model's own translation (default: %(default)s)")
    p.add_argument("-o", "--output-dir", default="attention", help="folder for layerN.png and average.png (default: %(default)s)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    install_excepthook()  # a checkpoint that cannot be read: one line (fairseq's loader reads it)
    if not os.path.isfile(args.path):
        sys.exit(f"convs2s-plot-attention: error: {args.path}: no such checkpoint file")
    try:
        hub = from_pretrained(os.path.dirname(os.path.abspath(args.path)), os.path.basename(args.path), args.data)
    except FileNotFoundError as e:
        sys.exit(f"convs2s-plot-attention: error: {e}")
    attention = hub.layer_attention(args.source, args.target, beam=args.beam)
    for path in plot_attention(attention, args.output_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
