#!/usr/bin/env bash
# tests/cli/gpu_check_dry_run.sh: tools/gpu_check.sh packs what the GPU machine lacks and runs
# its whole sequence here on the CPU from that pack, with the system's copies of the packed
# libraries hidden; every row must pass. First a check cut off in its third step: the rows of
# the two steps it finished are in $OUT already. Skipped (77) where no private mount namespace
# can be made.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
if ! unshare -m --propagation private true 2>/dev/null; then
  echo "skipped: unshare -m is not allowed here"
  exit 77
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$repo/tools/gpu_check.sh" --list
"$repo/tools/gpu_check.sh" --pack "$dir"

# Cut off while the third step runs: load's and nccl's rows and logs must be in OUT.
OUT="$dir/cut" setsid "$repo/tools/gpu_check.sh" --dry-run --from "$dir" \
  --step load,nccl,consistency_float32 >"$dir/cut.log" 2>&1 &
leader=$!
for _ in $(seq 600); do
  grep -q "step consistency_float32 (budget" "$dir/cut.log" 2>/dev/null && break
  kill -0 "$leader" 2>/dev/null || break
  sleep 0.5
done
kill -TERM -- "-$leader" 2>/dev/null || true
wait "$leader" 2>/dev/null || true
cat "$dir/cut.log"
for row in "the pack's programs load | ok" "communicator on cpu, 1 rank(s) | ok"; do
  grep -qF "$row" "$dir/cut/gpu_check.md" || {
    echo "FAIL: the cut-off check left no row '$row' in OUT:"
    cat "$dir/cut/gpu_check.md" 2>/dev/null
    exit 1
  }
done
[[ -s "$dir/cut/logs/nccl_1.log" ]] || { echo "FAIL: nccl's log is not in OUT/logs"; exit 1; }
echo "ok: a check cut off in its third step kept the rows and logs of the two it finished"

"$repo/tools/gpu_check.sh" --dry-run --from "$dir"
