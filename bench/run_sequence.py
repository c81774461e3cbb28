#!/usr/bin/python3
"""bench/run_sequence.py: the cost of long sequences at a fixed number of tokens per step, in
one invocation: runs bench_sequence (the issue-12 model: hidden 512, 8 layers, 8 heads, 8 kv
heads, ffn 1536, vocab 32000 tied) with the platform's OpenBLAS overrides removed. In one
process it measures peak tensor memory of a step at sequence 256 x micro-batch 8 and at 2048 x
micro-batch 1 (2048 tokens per step each), then alternates single steps of the two for `pairs`
pairs, and prints the median of the pairs' tokens/s ratios against what three FLOP counts of
the causal attention predict. The target is the executed count, the FLOPs this attention
performs (FlashAttention's count of its own kernels: the backward forms the scores again,
since the attention keeps no [heads, s, s] probabilities); counted once (the engine's MFU
count) and Megatron-LM's formula (full s x s) are printed for comparison.

Earlier versions ran each shape in its own process, minutes apart: the machine's speed
drifts by several percent in that time, and one invocation's ratio ranged 0.77-0.88.
Extra key=value arguments go to both shapes (e.g. memory.attention_block_rows=0 for the dense
attention).

Usage: bench/run_sequence.py [--build build] [--pairs 16] [--threads 2] [key=value ...]"""
import argparse
import os
import subprocess
import sys

from bench_env import clean_environment, describe_removed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--pairs", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    # The flags of the earlier, one-process-per-shape driver (README tables before 2026-12-04
    # noon quote them).
    p.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args, extra = p.parse_known_args()
    if args.rounds is not None or args.steps is not None:
        p.error("--rounds and --steps belonged to the earlier driver, which ran each shape in "
                "its own process; this one alternates single steps in one process: give "
                "--pairs N (default 16)")
    binary = os.path.join(args.build, "bench", "bench_sequence")
    if describe_removed():
        print(describe_removed(), flush=True)
    command = [binary, str(args.pairs), str(args.threads), "256", "2048"] + extra
    result = subprocess.run(command, env=clean_environment(), capture_output=True, text=True)
    sys.stdout.write("".join(line + "\n" for line in result.stdout.splitlines()
                             if not line.startswith("json: ")))
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(result.returncode)


if __name__ == "__main__":
    main()
