"""The attention of every decoder layer that attends, and their average, drawn as heatmaps
(the figures of ``convs2s-plot-attention``)::

    hub = ConvS2SModel.from_pretrained("checkpoints", data_name_or_path="data")
    figures = plot_attention(hub.layer_attention(source, target), "attention/")

writes ``attention/layerN.png`` for each decoder layer N that attends and
``attention/average.png`` for their average (the attention ``--print-alignment soft`` prints
and unknown-word replacement uses), with the source tokens on the x axis and the target
tokens on the y axis, as the paper's attention figures.
"""
import os

from convs2s_preprocess.runtime.atomic import atomic_file


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
        with atomic_file(path) as temp:  # no half-written picture under the name
            figure.savefig(temp, format="png", dpi=100)
        figures[path] = figure
    return figures
