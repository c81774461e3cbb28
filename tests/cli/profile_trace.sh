#!/usr/bin/env bash
# tests/cli/profile_trace.sh: logging.profile_steps=[2,3] under `mpirun -np 2` (TP2) writes
# run.dir/trace/trace.json, a Chrome trace holding, for each rank (pid), the spans of steps
# 2 and 3 only, their forward and backward micro-batches, the gradient sync and optimizer,
# communication waits named by operation and group, and torch's ops, each inside a step.
# Usage: profile_trace.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun --oversubscribe -np 2 "$train" "$configs/tiny.yaml" data.paths="[$corpus]" \
  model.layers=2 model.hidden=64 model.ffn_hidden=172 data.seq_len=32 training.global_batch=8 \
  training.micro_batch=4 training.steps=5 training.eval_every=0 runtime.peak_gflops=100 \
  runtime.threads=1 checkpoint.save_at_end=false parallel.tensor=2 \
  "logging.profile_steps=[2,3]" run.dir="$work/run" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
grep "Chrome trace" "$work/log"
"$python" - "$work/run/trace/trace.json" <<'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
ok = True
for rank in (0, 1):
    mine = [e for e in events if e["pid"] == rank]
    steps = {e["name"]: e for e in mine if e["name"].startswith("retort step ")}
    names = {e["name"] for e in mine}
    comm = sorted(n for n in names if n.startswith("comm "))
    ops = [e for e in mine if e["cat"] == "op"]
    inside = lambda e: any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1
                           for s in steps.values())
    outside = [e["name"] for e in mine if e["cat"] != "op" and not e["name"].startswith("retort step")
               and not inside(e)]
    print(f"rank {rank}: steps {sorted(steps)}, {len(ops)} op events, communication {comm}")
    ok &= sorted(steps) == ["retort step 2", "retort step 3"]
    ok &= {"retort forward micro-batch 0", "retort backward micro-batch 1", "retort gradient sync",
           "retort optimizer"} <= names
    ok &= "comm all_reduce [tp]" in names and len(ops) > 100
    ok &= all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in mine)
    if outside:
        print(f"  spans outside every step: {outside[:5]}")
        ok = False
sys.exit(0 if ok else 1)
PY
