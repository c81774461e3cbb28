"""tests/cli/resumed_equals_straight.py: an interrupted and resumed run against the same run
left uninterrupted: both logged every step 1..STEPS (the last record of a step counts, the
resumed run's where it repeats one), with bitwise the same loss and gradient norm.
Usage: resumed_equals_straight.py STRAIGHT_RUN_DIR RESUMED_RUN_DIR STEPS"""
import json
import sys

straight_dir, resumed_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])


def records(run_dir):
    return {r["step"]: r for r in map(json.loads, open(f"{run_dir}/metrics.jsonl"))}


straight, resumed = records(straight_dir), records(resumed_dir)
assert sorted(straight) == list(range(1, steps + 1)), "reference run incomplete"
assert sorted(resumed) == list(range(1, steps + 1)), f"steps logged: {sorted(resumed)}"
bad = [s for s in straight for k in ("loss", "grad_norm") if straight[s][k] != resumed[s][k]]
print(f"{steps} steps: loss and grad_norm bitwise equal to the uninterrupted run: {not bad}")
sys.exit(1 if bad else 0)
