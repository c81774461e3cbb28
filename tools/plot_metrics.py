#!/usr/bin/env python3
"""tools/plot_metrics.py: plots training (and validation) loss from one or more
metrics.jsonl files into a PNG. Usage: plot_metrics.py METRICS.jsonl [...] OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: plot_metrics.py METRICS.jsonl [...] OUT.png")
    *inputs, output = argv[1:]
    fig, ax = plt.subplots(figsize=(7, 4))
    for path in inputs:
        rows = [json.loads(line) for line in open(path) if line.strip()]
        label = path.rsplit("/", 2)[-2] if "/" in path else path
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=f"{label} train")
        valid = [r for r in rows if "valid_loss" in r]
        if valid:
            ax.plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o--",
                    label=f"{label} valid")
    ax.axhline(5.545, color="grey", lw=0.8, ls=":", label="ln(256)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    print(f"wrote {output}")


if __name__ == "__main__":
    main(sys.argv)
