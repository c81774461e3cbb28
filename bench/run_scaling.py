#!/usr/bin/python3
"""bench/run_scaling.py: parallel speed-up on this machine, one compute thread per rank, in
one invocation. Alternates, `rounds` times, bench_scaling on one rank, on two ranks in data
parallel (each rank the one-rank micro-batch, so twice the tokens per step) and on two ranks
in tensor parallel (the same tokens per step, the model split), and prints the best tokens/s
of each, the speed-up over one rank, and the exposed communication per step.

Each multi-rank row also gives its ranks' compute per step (step time less the rank's own
waits), slowest and fastest: the ranks of DP2 do the same work, so a gap between them means
one core ran slower during that run, and the step waited for it.

It also runs one rank pinned to each CPU (taskset), to show whether the cores are equal: a
data-parallel step waits for its slowest rank, so a slower core bounds the speed-up. Those
rows are information only; speed-ups are against the unpinned one rank.

Usage: bench/run_scaling.py [--build build] [--rounds 2] [--steps 3]"""
import argparse
import json
import os
import subprocess

from bench_env import clean_environment, describe_removed

MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
LAYOUTS = [  # (name, ranks, key=value)
    ("1 rank", 1, []),
    ("DP2", 2, ["parallel.data=2", "training.global_batch=8"]),
    ("TP2", 2, ["parallel.tensor=2"]),
    ("TP2 + sequence parallel", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
]
TARGETS = {"DP2": 1.85, "TP2": 1.6}


def run(command):
    env = clean_environment(dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("json: "):
            return json.loads(line[len("json: "):])
    raise RuntimeError("no result from " + " ".join(command) + ":\n" + out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    binary = os.path.join(args.build, "bench", "bench_scaling")
    best = {}
    cpus = sorted(os.sched_getaffinity(0))
    pinned = [("1 rank on CPU %d" % c, c) for c in cpus] if len(cpus) > 1 else []
    for _ in range(args.rounds):
        for name, ranks, keys in LAYOUTS:
            r = run(MPIRUN + ["-np", str(ranks), binary, str(args.steps)] + keys)
            if name not in best or r["tokens_per_s"] > best[name]["tokens_per_s"]:
                best[name] = r
        for name, cpu in pinned:
            r = run(["taskset", "-c", str(cpu)] + MPIRUN + ["-np", "1", binary, str(args.steps)])
            if name not in best or r["tokens_per_s"] > best[name]["tokens_per_s"]:
                best[name] = r
    base = best["1 rank"]["tokens_per_s"]
    print("model: hidden 512, 8 layers, 8 heads, 8 kv heads, ffn 1536, vocab 32000 tied, "
          "micro-batch 4 x seq 256, fp32, 1 thread per rank; best of %d rounds" % args.rounds)
    if describe_removed():
        print(describe_removed())
    print("| layout | tokens/s | speed-up | target | step s | exposed comm s/step "
          "| ranks' compute s/step, slowest / fastest |")
    print("|---|---|---|---|---|---|---|")
    for name in [n for n, _, _ in LAYOUTS] + [n for n, _ in pinned]:
        r = best[name]
        target = TARGETS.get(name)
        slow, fast = r["compute_slowest_s"], r["compute_fastest_s"]
        spread = ("%.3f / %.3f (%.1f%% apart)" % (slow, fast, 100 * (slow / fast - 1))
                  if r["ranks"] > 1 else "-")
        print("| %s | %.0f | %.2fx | %s | %.3f | %.3f | %s |" % (
            name, r["tokens_per_s"], r["tokens_per_s"] / base,
            (">= %.2fx" % target) if target else "-", r["step_s"], r["exposed_comm_s"], spread))


if __name__ == "__main__":
    main()
