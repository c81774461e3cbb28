"""examples/compare_precision.py: two runs of the same job in two precisions, compared from
their metrics.jsonl: for each loss term (loss, lm_loss, logit_loss, activation_loss), the
largest relative difference |b - a| / |a| over the steps both logged after --after, against
--limit; and one panel per pair with both runs' loss curves. Exits 1 when a term exceeds the
limit.
Usage: compare_precision.py --after 50 --limit 0.02 --pair NAME RUN_A RUN_B [--pair ...]
         [--plot OUT.png]"""
import argparse
import json
import os
import sys

TERMS = ("loss", "lm_loss", "logit_loss", "activation_loss")


def load(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))
            if line.strip()]
    return {r["step"]: r for r in rows if "step" in r and not r.get("skipped")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--after", type=int, default=50)
    p.add_argument("--limit", type=float, default=0.02)
    p.add_argument("--pair", nargs=3, action="append", required=True,
                   metavar=("NAME", "RUN_A", "RUN_B"))
    p.add_argument("--plot", default="")
    a = p.parse_args()
    failed = False
    print(f"| job | term | steps compared | largest relative difference after step {a.after} "
          "| at step | final A | final B |")
    print("|---|---|---|---|---|---|---|")
    for name, run_a, run_b in a.pair:
        rows_a, rows_b = load(run_a), load(run_b)
        steps = sorted(s for s in rows_a if s in rows_b and s > a.after)
        if not steps:
            sys.exit(f"{name}: no step after {a.after} logged by both runs")
        for term in TERMS:
            if term not in rows_a[steps[0]]:
                continue
            worst, at = max((abs(rows_b[s][term] - rows_a[s][term]) / abs(rows_a[s][term]), s)
                            for s in steps)
            failed |= worst > a.limit
            print(f"| {name} | {term} | {len(steps)} | {100 * worst:.2f}% | {at} | "
                  f"{rows_a[steps[-1]][term]:.4f} | {rows_b[steps[-1]][term]:.4f} |")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(a.pair), figsize=(6 * len(a.pair), 4), squeeze=False)
        for axis, (name, run_a, run_b) in zip(axes[0], a.pair):
            for run, style in ((run_a, "-"), (run_b, "--")):
                rows = load(run)
                steps = sorted(rows)
                for term in TERMS:
                    if term in rows[steps[0]]:
                        axis.plot(steps, [rows[s][term] for s in steps], style,
                                  label=f"{term} ({os.path.basename(run)})")
            axis.set_title(name)
            axis.set_xlabel("step")
            axis.set_ylabel("nats/token (log scale)")
            axis.set_yscale("log")
            axis.legend(fontsize=7)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(a.plot)), exist_ok=True)
        fig.savefig(a.plot, dpi=100)
        print(f"plot: {a.plot}")
    print("FAIL: a term is more than the limit apart" if failed else
          f"every term within {100 * a.limit:.0f}% after step {a.after}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
