#!/usr/bin/env python3
"""bench/compare_builds.py: one benchmark of two builds, run in alternating pairs in one
invocation, so that the machine's drift from minute to minute falls on both alike.

Each pair runs the two builds' binary once each, the order swapping every pair (A B, B A, ...).
A number is read from each run's output: the first table row whose first cell is ROW, its
second cell (the benchmarks print Markdown tables). Prints every pair, each side's median and
spread (min-max), and the median of the per-pair ratios B/A.

Usage: compare_builds.py BUILD_A BUILD_B PAIRS ROW -- BENCH [ARGS...]
  BUILD_A, BUILD_B: build folders (their bench/BENCH binaries run); ROW: e.g. 'tokens/s'.
Example (the kernels move, docs/benchmarks.md):
  bench/compare_builds.py /tmp/before/build build 5 'tokens/s' -- bench_throughput 4 2
"""
import os
import statistics
import subprocess
import sys


def table_value(output: str, row: str) -> float:
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] == row:
            return float(cells[1].split()[0].rstrip("%"))
    raise SystemExit(f"error: no table row '{row}' in the benchmark's output:\n{output[-2000:]}")


def run(build: str, bench: list, row: str) -> float:
    binary = os.path.join(build, "bench", bench[0])
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"error: {binary} is not an executable (build it first)")
    done = subprocess.run([binary] + bench[1:], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {binary} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return table_value(done.stdout, row)


def main() -> None:
    if "--" not in sys.argv or sys.argv.index("--") != 5:
        raise SystemExit(__doc__)
    build_a, build_b, pairs, row = sys.argv[1:5]
    bench = sys.argv[6:]
    if not bench:
        raise SystemExit(__doc__)
    try:
        pairs = int(pairs)
    except ValueError:
        raise SystemExit(f"error: PAIRS '{pairs}' is not a whole number")
    if pairs < 1:
        raise SystemExit(f"error: PAIRS must be at least 1 (got {pairs})")
    a_values, b_values = [], []
    for i in range(pairs):
        order = [("A", build_a), ("B", build_b)]
        if i % 2:
            order.reverse()
        got = {}
        for name, build in order:
            got[name] = run(build, bench, row)
        a_values.append(got["A"])
        b_values.append(got["B"])
        print(f"pair {i + 1} ({order[0][0]} first): A {got['A']:.1f}  B {got['B']:.1f}  "
              f"B/A {got['B'] / got['A']:.3f}", flush=True)
    ratios = [b / a for a, b in zip(a_values, b_values)]
    print(f"A {build_a}: median {statistics.median(a_values):.1f} "
          f"(spread {min(a_values):.1f}-{max(a_values):.1f})")
    print(f"B {build_b}: median {statistics.median(b_values):.1f} "
          f"(spread {min(b_values):.1f}-{max(b_values):.1f})")
    print(f"B/A per pair: median {statistics.median(ratios):.3f} "
          f"(spread {min(ratios):.3f}-{max(ratios):.3f}); B ahead in "
          f"{sum(r > 1 for r in ratios)} of {pairs}")


if __name__ == "__main__":
    main()
