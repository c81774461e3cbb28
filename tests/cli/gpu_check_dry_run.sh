#!/usr/bin/env bash
# tests/cli/gpu_check_dry_run.sh: tools/gpu_check.sh packs what the GPU machine lacks and runs
# its whole sequence here on the CPU from that pack, with the system's copies of the packed
# libraries hidden; every row must pass. Skipped (77) where no private mount namespace can be
# made.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
if ! unshare -m --propagation private true 2>/dev/null; then
  echo "skipped: unshare -m is not allowed here"
  exit 77
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$repo/tools/gpu_check.sh" --pack "$dir"
"$repo/tools/gpu_check.sh" --dry-run --from "$dir"
