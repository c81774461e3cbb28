#!/usr/bin/env bash
# tests/cli/progress_line.sh: engine_train on a terminal (a pseudo-terminal from script(1))
# redraws a progress line in place after every step (carriage return + erase-line, with
# step, loss, tok/s, MFU and ETA); with output to a file it writes plain lines only, no
# control characters, also under mpirun.
# Usage: progress_line.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=("$configs/tiny.yaml" data.paths="[$corpus]" model.layers=2 model.hidden=64
      model.ffn_hidden=172 data.seq_len=32 training.global_batch=8 training.micro_batch=4
      training.steps=6 training.log_every=3 training.eval_every=0 runtime.peak_gflops=100
      runtime.threads=1 checkpoint.save_at_end=false)
script -qec "$(printf '%q ' "$train" "${args[@]}" run.dir="$work/tty")" "$work/tty.out" >/dev/null
"$train" "${args[@]}" run.dir="$work/file" >"$work/file.out" 2>&1
# Under mpirun a rank's stdout is mpirun's pseudo-terminal, whatever mpirun writes to.
mpirun --oversubscribe -np 2 "$train" "${args[@]}" run.dir="$work/mpi" >"$work/mpi.out" 2>&1
"$python" - "$work" <<'PY'
import re, sys
work = sys.argv[1]
tty = open(f"{work}/tty.out", "rb").read().decode()
redraws = re.findall(r"\r\x1b\[Kstep (\d)/6 \| loss [0-9.]+ \| \d+ tok/s \| MFU [0-9.]+% \| ETA",
                     tty)
print(f"terminal: progress redrawn for steps {redraws}")
plain = open(f"{work}/file.out").read() + open(f"{work}/mpi.out").read()
metric_lines = re.findall(r"^step [36]/6 \| loss .* \| lr ", plain, re.M)
control = bool(re.search(r"[\r\x1b]", plain))
print(f"file: {len(metric_lines)} metric lines, control characters: {control}")
ok = redraws == [str(s) for s in range(1, 7)] and len(metric_lines) == 4 and not control
sys.exit(0 if ok else 1)
PY
