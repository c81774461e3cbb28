#!/usr/bin/env bash
# tools/fuzz.sh: builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) and runs
# them. The corpus of inputs found so far lives in tests/fuzz/corpus/<target>/ and is only
# read: a run works on a copy, so a test run leaves the tree as it was.
#   tools/fuzz.sh build BUILD_DIR                    configure and build the targets
#   tools/fuzz.sh run BUILD_DIR TARGET SECONDS       fuzz TARGET (config, idx, safetensors)
#   tools/fuzz.sh merge BUILD_DIR TARGET SECONDS     fuzz, then fold new inputs into the corpus
# A crash, a sanitizer report or a leak makes the run fail with the input saved and printed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=$1 build=$2
if [ "$mode" = build ]; then
  cmake -S "$root/tests/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  exec ninja -C "$build"
fi
seconds=$4
target=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
cp "$root/tests/fuzz/corpus/$target/"* "$work/corpus/"
status=0
"$build/fuzz_$target" "$work/corpus" -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" -rss_limit_mb=1024 >"$work/log" 2>&1 || status=$?
grep -E "^Done|stat::number_of_executed_units|stat::new_units_added" "$work/log" || true
if [ $status -ne 0 ]; then
  grep -E "ERROR|SUMMARY|runtime error|leak" "$work/log" | head -20
  for artifact in "$work/artifacts/"*; do
    mkdir -p "$build/artifacts" && cp "$artifact" "$build/artifacts/"
    echo "input saved to $build/artifacts/$(basename "$artifact"):"
    od -c "$artifact" | head -20
  done
  echo "FAIL: fuzz_$target exited $status"
  exit 1
fi
if [ "$mode" = merge ]; then
  "$build/fuzz_$target" -merge=1 "$root/tests/fuzz/corpus/$target" "$work/corpus" >/dev/null 2>&1
  echo "corpus: $(ls "$root/tests/fuzz/corpus/$target" | wc -l) inputs"
fi
echo "fuzz_$target: $seconds s without a crash, sanitizer report or leak"
