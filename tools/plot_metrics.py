#!/usr/bin/env python3
"""tools/plot_metrics.py: PNG curves of one or several runs from their metrics.jsonl: every
loss term (total, LM, logit and activation losses, validation loss), learning rate,
throughput (tokens/s) and peak memory, one panel each, one colour per run.
Usage: plot_metrics.py RUN_DIR_OR_METRICS.jsonl [...] OUT.png"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LOSS_TERMS = ("loss", "lm_loss", "logit_loss", "activation_loss", "valid_loss")
PANELS = (("losses", "loss (nats/token)"), ("lr", "learning rate"),
          ("tokens_per_s", "tokens/s"), ("peak_mem_bytes", "peak memory (MB)"))


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if not r.get("skipped")]  # skipped steps carry no curves
    if not rows:
        sys.exit(f"{path}: no metrics lines")
    name = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return name, rows


def series(rows, key, scale=1.0):
    points = [(r["step"], r[key] * scale) for r in rows
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    *inputs, output = argv[1:]
    runs = [load(path) for path in inputs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    styles = {"loss": "-", "lm_loss": "--", "logit_loss": "-.", "activation_loss": ":",
              "valid_loss": "o-"}
    for colour, (name, rows) in enumerate(runs):
        c = f"C{colour}"
        ax = axes[0][0]
        for term in LOSS_TERMS:
            steps, values = series(rows, term)
            if steps:
                ax.plot(steps, values, styles[term], color=c, ms=3, label=f"{name} {term}")
        for ax, (key, _) in zip(axes.flat[1:], PANELS[1:]):
            steps, values = series(rows, key, 1e-6 if key == "peak_mem_bytes" else 1.0)
            ax.plot(steps, values, color=c, label=name)
    for ax, (_, label) in zip(axes.flat, PANELS):
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(" vs ".join(name for name, _ in runs))
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    print(f"wrote {output}: {len(runs)} run(s), panels: "
          f"{', '.join(label for _, label in PANELS)}")


if __name__ == "__main__":
    main(sys.argv)
