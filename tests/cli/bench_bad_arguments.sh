#!/usr/bin/env bash
# tests/cli/bench_bad_arguments.sh: a benchmark given a positional count that is not a whole
# number >= 1 (a key=value where the thread count goes, a word, 0) ends with exit 2 and one
# "error:" line naming the argument's position, its meaning and the text, instead of torch's
# abort with a c10 stack trace.
# bench_sequence also refuses a long sequence that is not a multiple of the short one.
# Usage: bench_bad_arguments.sh BENCH_THROUGHPUT BENCH_ATTENTION BENCH_SEQUENCE
set -uo pipefail
throughput=$1 attention=$2 sequence=$3
failed=0
expect_error() {  # expect_error WHAT_IN_THE_MESSAGE COMMAND...
  local want=$1
  shift
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne 2 ]]; then
    echo "FAIL: '$*' exited $rc, not 2: $out"
    failed=1
  elif ! grep -q "^error: .*$want" <<<"$out"; then
    echo "FAIL: '$*' printed no 'error: ...$want': $out"
    failed=1
  elif grep -q "c10::Error" <<<"$out"; then
    echo "FAIL: '$*' reached torch: $out"
    failed=1
  fi
}
expect_error "argument 2 (threads) must be a whole number >= 1, got 'model.hidden=512'" \
  "$throughput" 2 model.hidden=512
expect_error "argument 1 (steps) must be a whole number >= 1, got 'two'" "$throughput" two
expect_error "argument 2 (threads) must be a whole number >= 1, got '0'" "$attention" 256 0
expect_error "argument 1 (sequence length) must be a whole number >= 1, got '2k'" "$attention" 2k
expect_error "argument 1 (pairs) must be a whole number >= 1, got '0'" "$sequence" 0
expect_error "the long sequence (1000) must be a multiple of the short one (256)" \
  "$sequence" 2 2 256 1000
[[ $failed -eq 0 ]] && echo "benchmarks reject bad counts with a clear error"
exit $failed
