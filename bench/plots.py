"""The benchmark's figures as pictures: PNGs drawn from its ``--json`` results.

``python -m bench.benchmark ... --json r.json --plots DIR`` writes them after a run, and
``python -m bench.plots r.json [more.json ...] -o DIR`` draws them from saved results, one
file or several (a file holds one run's record or a list of them, so the results of every
run on every machine can sit in one file: docs/performance/results.json is such a file, and
the documentation's performance page embeds the PNGs drawn from it).

A record is what ``--json`` writes: ``{"args": {...}, "machine": {"device": ...},
"results": {RUN: {METRIC: value}}}``, plus ``"commit"`` and ``"command"``. Runs are compared
with the record's ``fconv`` run. Three pictures, each with one panel per machine:

- ``speed.png``: ours / fconv in training (target tokens/s) and generation (sentences/s at
  beam 5 and 1), each data setting a group of bars, one bar per run;
- ``memory.png``: ours / fconv peak memory in training and generation;
- ``bleu-time.png``: BLEU after training against the seconds trained (``--train-bleu``
  records that hold ``train seconds``, and the recipes' time-bounded runs), one panel per run
  of the benchmark that trained two systems or more: points of different runs, on different
  hosts under one machine's name, are not compared.

The pictures are drawn at the width of the documentation's text (8 inches at 110 dpi), with
labels of 9 to 11 points, so that they read at the size the site shows them. Records whose
data setting is unknown (older records without ``args.data``) are left out of the pictures.
"""
import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

SPEED = {"train tokens/s": "training", "beam 5 sentences/s": "beam 5", "beam 1 sentences/s": "beam 1"}
MEMORY = {"train peak MiB": "training", "generate peak MiB": "generation"}
BASELINE = "fconv"
# the runs in a fixed order, each with the same colour in every panel and picture
RUNS = ["ours", "ours, stock search", "ours bf16", "ours fp16", "ours, vocabulary selection",
        "ours, selection, lua softmax"]


def load(paths):
    """Every record of the JSON files ``paths`` (each holds one record or a list)."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        records += data if isinstance(data, list) else [data]
    return records


WIDTH = 8  # inches: the documentation's text width at the figures' dpi
DPI = 110
SETTINGS = {"demo": "BPE", "words": "words"}


def setting(record):
    """The data a record measured, as a short label: ``BPE``, ``words``, ``BPE, 1000 most common``;
    None where the record does not say."""
    args = record.get("args", {})
    label = SETTINGS.get(args.get("data"))
    if label is None:
        return None
    if args.get("vocab_most_common"):
        label += f", {args['vocab_most_common']} most common"
    return label


def ratios(records, metrics):
    """``{machine: {group label: {run: ours / fconv}}}`` for every run, metric and record
    that has both the run's and fconv's value of the metric."""
    table = {}
    for record in records:
        results = record.get("results", {})
        baseline = results.get(BASELINE, {})
        for metric, name in metrics.items():
            if not baseline.get(metric) or setting(record) is None:
                continue
            group = table.setdefault(record["machine"]["device"], {}).setdefault(f"{setting(record)}\n{name}", {})
            for run, values in results.items():
                if run != BASELINE and isinstance(values, dict) and isinstance(values.get(metric), (int, float)):
                    group[run] = values[metric] / baseline[metric]
    return table


def bar_panels(table, title, ylabel, path):
    """One panel of grouped bars per machine, a dashed line at fconv's 1.0; written to ``path``."""
    machines = list(table)
    fig, axes = plt.subplots(len(machines), 1, figsize=(WIDTH, 4.2 * len(machines)), squeeze=False)
    for ax, machine in zip(axes[:, 0], machines):
        groups = table[machine]
        runs = sorted({run for group in groups.values() for run in group}, key=_run_order)
        colours = plt.get_cmap("tab10").colors
        width = 0.8 / max(len(runs), 1)
        for i, run in enumerate(runs):
            xs = [g + (i - (len(runs) - 1) / 2) * width for g, group in enumerate(groups) if run in groups[group]]
            ys = [groups[group][run] for group in groups if run in groups[group]]
            bars = ax.bar(xs, ys, width, label=run, color=colours[_run_order(run)[0] % len(colours)])
            ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], fontsize=8)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(groups)), list(groups), fontsize=10)
        ax.tick_params(axis="y", labelsize=10)
        ax.set_ylabel(ylabel, fontsize=10)
        ax.set_title(machine, fontsize=11)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.08)  # room for the bars' labels
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(len(runs), 3), frameon=False)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _run_order(run):
    return (RUNS.index(run) if run in RUNS else len(RUNS), run)


def panels_of_bleu_time(records):
    """``[(title, [(minutes, BLEU, label)])]``: a panel for each record of known data that
    trained two systems or more."""
    panels = []
    for record in records:
        if setting(record) is None:
            continue
        marks = [(values["train seconds"] / 60, values["BLEU after training"], f"{run} ({setting(record)})")
                 for run, values in record.get("results", {}).items()
                 if isinstance(values, dict) and "BLEU after training" in values and "train seconds" in values]
        if len(marks) >= 2:
            panels.append((f"{record['machine']['device']}\n(one run, {record.get('commit', '?')})", marks))
    return panels


def bleu_time(records, path):
    """BLEU after training against training minutes: a panel per run of the benchmark (one
    record: one machine, one commit) that trained two systems or more, a point per system."""
    panels = panels_of_bleu_time(records)
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(WIDTH, 4 * len(panels)), squeeze=False)
    for ax, (title, marks) in zip(axes[:, 0], panels):
        for minutes, score, label in marks:
            ax.scatter([minutes], [score], label=label, s=40)
            ax.annotate(f"{score:.1f}", (minutes, score), textcoords="offset points", xytext=(6, 4), fontsize=10)
        ax.set_xlabel("training time (minutes)", fontsize=10)
        ax.set_ylabel("sacreBLEU, test_2016_flickr", fontsize=10)
        ax.tick_params(labelsize=10)
        ax.set_xlim(left=0, right=max(m for m, _, _ in marks) * 1.15)
        ax.set_ylim(bottom=0, top=max(s for _, s, _ in marks) * 1.15)
        ax.set_title(title, fontsize=11)
        ax.legend(fontsize=9, loc="lower right")
    fig.suptitle("BLEU against training time", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def render(records, out_dir):
    """Every picture the records allow, into ``out_dir``; the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    speed = ratios(records, SPEED)
    if speed:
        written.append(bar_panels(speed, "Speed against fconv (ours / fconv; higher is faster)", "x fconv",
                                  out / "speed.png"))
    memory = ratios(records, MEMORY)
    if memory:
        written.append(bar_panels(memory, "Peak memory against fconv (ours / fconv; lower is less)", "x fconv",
                                  out / "memory.png"))
    if (path := bleu_time(records, out / "bleu-time.png")) is not None:
        written.append(path)
    return written


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSON files written by `python -m bench.benchmark --json`")
    p.add_argument("-o", "--out", required=True, help="folder for the PNGs")
    args = p.parse_args(argv)
    for path in render(load(args.results), args.out):
        print(path)


if __name__ == "__main__":
    main()
