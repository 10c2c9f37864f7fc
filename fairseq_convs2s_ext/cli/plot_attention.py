"""``convs2s-plot-attention``: the attention of every decoder layer for a sentence pair, drawn.

    convs2s-plot-attention --path checkpoints/checkpoint_best.pt --data data/en-de \\
        --source "Two dogs play in the snow." --target "Zwei Hunde spielen im Schnee." -o attention/

writes ``attention/layerN.png`` for each decoder layer N that attends and
``attention/average.png`` for their average (the attention ``--print-alignment soft`` prints
and unknown-word replacement uses): heatmaps with the source tokens on the x axis and the
target tokens on the y axis, as the paper's attention figures. Without ``--target`` the
model's own translation (beam search) is drawn. ``--data`` is the folder convs2s-prepare
wrote (or its ``bin/``); sentences are raw text, tokenized and BPE-segmented as prepared.

From Python::

    hub = ConvS2SModel.from_pretrained("checkpoints", data_name_or_path="data/en-de")
    figures = plot_attention(hub.layer_attention(source, target), "attention/")
"""
import argparse
import os
import sys


def heatmap(matrix, source_tokens, target_tokens, title):
    """A figure of ``matrix`` (target tokens x source tokens, values in [0, 1])."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(2 + 0.4 * len(source_tokens), 1.5 + 0.35 * len(target_tokens)))
    FigureCanvasAgg(figure)  # draw off-screen, whatever matplotlib's configured backend
    axes = figure.add_subplot()
    image = axes.imshow(matrix.numpy(), cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(len(source_tokens)), source_tokens, rotation=90)
    axes.set_yticks(range(len(target_tokens)), target_tokens)
    axes.set_xlabel("source")
    axes.set_ylabel("target")
    axes.set_title(title)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    return figure


def plot_attention(attention, out_dir):
    """Write one PNG per attending layer and one of their average; returns {path: figure}."""
    matrices = {f"layer{n}": (a, f"decoder layer {n}") for n, a in attention.layers.items()}
    matrices["average"] = (attention.average, f"average of layers {', '.join(map(str, attention.layers))}")
    figures = {}
    os.makedirs(out_dir, exist_ok=True)
    for name, (matrix, title) in matrices.items():
        path = os.path.join(out_dir, f"{name}.png")
        figure = heatmap(matrix, attention.source_tokens, attention.target_tokens, title)
        temp = f"{path}.tmp"  # renamed when complete: no half-written picture under the name
        try:
            figure.savefig(temp, format="png", dpi=100)
            os.replace(temp, path)
        finally:
            if os.path.exists(temp):
                os.remove(temp)
        figures[path] = figure
    return figures


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
    from ..models.hub_interface import from_pretrained  # imports fairseq and torch: after --help

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
