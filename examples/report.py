#!/usr/bin/env python3
"""examples/report.py: the table and loss curves of examples/distill_experiments.sh.
Usage: report.py RUNS_DIR OUT_DIR. Writes OUT_DIR/table.md and OUT_DIR/lm_loss.png,
OUT_DIR/logit_loss.png from each run's metrics.jsonl. A student trained from the teacher cache
too (run NAME-cached) gets its final losses and the wall time of both runs in the table."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["teacher", "scratch", "attn-reset", "layer2-reset", "window16", "window64"]


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def main(runs, out):
    os.makedirs(out, exist_ok=True)
    runs_found = [r for r in ORDER if os.path.exists(f"{runs}/{r}/metrics.jsonl")]
    data = {r: rows(f"{runs}/{r}/metrics.jsonl") for r in runs_found}
    lines = ["| run | steps | final LM loss (train) | final logit loss | validation LM loss | "
             "time, teacher online (s) | time, teacher cache (s) |",
             "|---|---|---|---|---|---|---|"]

    def seconds(run):
        path = f"{runs}/{run}/wall_seconds"
        return f"{float(open(path).read()):.1f}" if os.path.exists(path) else "-"

    def losses(run):
        rows_of_run = rows(f"{runs}/{run}/metrics.jsonl")
        last = rows_of_run[-1]
        kd = last.get("logit_loss")
        valid = [x["valid_loss"] for x in rows_of_run if "valid_loss" in x]
        return (last["step"], f"{last.get('lm_loss', last['loss']):.4f}",
                "-" if kd is None else f"{kd:.4f}", "-" if not valid else f"{valid[-1]:.4f}")

    for r in runs_found:
        step, lm, kd, valid = losses(r)
        cached = f"{r}-cached"
        cached_time = seconds(cached) if os.path.exists(f"{runs}/{cached}") else "-"
        lines.append(f"| {r} | {step} | {lm} | {kd} | {valid} | {seconds(r)} | {cached_time} |")
        if os.path.exists(f"{runs}/{cached}/metrics.jsonl"):
            step, lm, kd, valid = losses(cached)
            lines.append(f"| {r}, from the cache | {step} | {lm} | {kd} | {valid} | - | "
                         f"{cached_time} |")
    if os.path.exists(f"{runs}/teacher_cache/wall_seconds"):
        lines.append("")
        lines.append(f"Writing the teacher cache once took {seconds('teacher_cache')} s.")
    open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    for key, label in (("lm_loss", "LM loss (nats/byte)"), ("logit_loss", "forward KL to teacher")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in runs_found:
            points = [(x["step"], x.get(key, x["loss"] if key == "lm_loss" else None))
                      for x in data[r]]
            points = [p for p in points if p[1] is not None]
            if points and (key != "logit_loss" or r != "teacher"):
                ax.plot(*zip(*points), label=r)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if key == "logit_loss":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/{key}.png", dpi=110)
        print(f"wrote {out}/{key}.png")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: report.py RUNS_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])
