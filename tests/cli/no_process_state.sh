#!/usr/bin/env bash
# tests/cli/no_process_state.sh SOURCE_DIR: layers/, distill/ and engine/ hold no mutable state
# at namespace scope or in statics beyond the short list below, which docs/architecture.md
# ("State a process holds") names and justifies: a run's settings live in its trainer's run
# context (layers/run_context.h), never in the process. Finds every static or thread_local
# variable and every namespace-scope variable that is not const, and fails naming any that is
# not on the list.
set -euo pipefail
root=${1:?usage: no_process_state.sh SOURCE_DIR}
cd "$root"
# file:variable of the allowed state.
allowed=(
  "layers/linear_products.cpp:panel"          # per-thread scratch of the tile products
  "engine/observe/memory_tracker.cpp:c"       # the allocator's byte counters (process-wide)
  "engine/observe/memory_tracker.cpp:table"   # the allocator's live blocks
  "engine/observe/memory_tracker.cpp:deleter" # the allocator's deleter it wraps
  "engine/observe/memory_tracker.cpp:installed"
  "engine/observe/memory_tracker.cpp:tracker"
  "engine/train/stop_signal.cpp:received_signal" # the process's signal flag
)
found=$(
  {
    # statics and thread_locals that are not const (functions and casts left out)
    grep -rnE --include=*.cpp --include=*.h \
      '^\s*(static|thread_local)\s+[^()]*\s+[A-Za-z_][A-Za-z0-9_]*\s*(=|;|\{|\[)' \
      layers distill engine |
      grep -vE '\b(const|constexpr|static_assert)\b' || true
    # namespace-scope variables (no indentation) of a mutable type
    grep -rnE --include=*.cpp --include=*.h \
      '^(std::atomic|std::mutex|std::map|std::unordered_map|std::vector|std::string|bool|int|int64_t|double|float|MPI_[A-Za-z]+)\b[^(]*\s[A-Za-z_][A-Za-z0-9_]*\s*(=|;|\{)' \
      layers distill engine |
      grep -vE '\b(const|constexpr)\b' || true
  } | sed -E 's/^([^:]+):[0-9]+:([^=;{[]*).*/\1:\2/' | # the declaration up to = ; { [
    sed -E 's/^([^:]+):.*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*$/\1:\2/' | sort -u
)
bad=0
while IFS= read -r entry; do
  [ -z "$entry" ] && continue
  ok=0
  for a in "${allowed[@]}"; do [ "$entry" = "$a" ] && ok=1; done
  if [ $ok = 0 ]; then
    echo "mutable process state not on the list: $entry"
    bad=1
  fi
done <<<"$found"
[ $bad = 0 ] && echo "no mutable process state beyond the $(printf '%s\n' "${allowed[@]}" | wc -l) listed"
exit $bad
