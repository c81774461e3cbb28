#!/usr/bin/python3
"""bench/peer/run_peer.py: Retort against the plain PyTorch eager loop of the same Llama
(bench/peer/torch_llama.py) on this machine, in one invocation. For each environment setting
it runs the two programs back to back in each of `rounds` rounds, every round going through
all settings (bench_throughput for Retort, with the model of issue 12: hidden 512, 8 layers, 8 heads, 8 kv heads, ffn 1536, vocab 32000 tied,
sequence 256, micro-batch 4, AdamW, fp32) and prints the best tokens/s of each, their ratio,
MFU against the fp32 GEMM peak Retort measures with the same threads, Retort's step-time
breakdown, and the ceiling the step's matrix products alone set (bench/products_floor.h).
With --pairs N it then runs Retort's defaults and PyTorch at its best setting back to back N
times (order alternating) and prints each pair's ratio and their median, for information.

Usage: bench/peer/run_peer.py [--build build] [--rounds 2] [--steps 5] [--threads 2] [--pairs 0]"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_env import clean_environment, describe_removed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_KEYS = ["model.hidden=512", "model.layers=8", "model.heads=8", "model.kv_heads=8",
              "model.ffn_hidden=1536"]
# glibc refuses an mmap threshold above 32 MB (HEAP_MAX_SIZE / 2) on 64-bit.
GLIBC_TUNED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 25), "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
               "MALLOC_TOP_PAD_": str(1 << 28)}
PASSIVE = {"OMP_WAIT_POLICY": "passive"}
# OpenBLAS's idle workers spin 2^10 cycles, not 2^28, before sleeping (Retort's default).
SHORT_SPIN = {"OPENBLAS_THREAD_TIMEOUT": "10"}
# libgomp's idle workers spin 10000 times (about 0.1 ms), not 0, before sleeping (Retort's
# default with passive).
OMP_SHORT_SPIN = {"GOMP_SPINCOUNT": "10000"}
LIB = "/usr/lib/x86_64-linux-gnu/"
# Retort's own set-up (mallopt, passive OpenMP) is off where another allocator is measured.
UNTUNED = {"RETORT_PROCESS_TUNING": "0"}
SETTINGS = [  # (name, environment of both programs); the first is nobody's settings
    ("defaults", {}),
    # Retort would preload jemalloc here without RETORT_ALLOCATOR=glibc (its default).
    ("glibc tuned + OMP passive", dict(GLIBC_TUNED, **PASSIVE, RETORT_ALLOCATOR="glibc")),
    ("glibc untuned + OMP passive", dict(PASSIVE, **UNTUNED)),
    ("jemalloc (no decay) + OMP passive",
     dict(PASSIVE, **UNTUNED, LD_PRELOAD=LIB + "libjemalloc.so.2",
          MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1")),
    ("tcmalloc + OMP passive",
     dict(PASSIVE, **UNTUNED, LD_PRELOAD=LIB + "libtcmalloc_minimal.so.4")),
    ("tcmalloc + OMP passive + OpenBLAS short spin",
     dict(PASSIVE, **SHORT_SPIN, **UNTUNED, LD_PRELOAD=LIB + "libtcmalloc_minimal.so.4")),
    ("tcmalloc + OMP passive, short spin + OpenBLAS short spin",
     dict(PASSIVE, **OMP_SHORT_SPIN, **SHORT_SPIN, **UNTUNED,
          LD_PRELOAD=LIB + "libtcmalloc_minimal.so.4")),
    # Transparent huge pages on request (the kernel's mode here is madvise): Retort's default
    # asks for them through jemalloc, so PyTorch is offered them too, through either allocator.
    ("jemalloc (no decay, huge pages) + OMP passive, short spin + OpenBLAS short spin",
     dict(PASSIVE, **OMP_SHORT_SPIN, **SHORT_SPIN, **UNTUNED,
          LD_PRELOAD=LIB + "libjemalloc.so.2",
          MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1,thp:always")),
    ("glibc tuned + huge pages + OMP passive, short spin + OpenBLAS short spin",
     dict(GLIBC_TUNED, **PASSIVE, **OMP_SHORT_SPIN, **SHORT_SPIN, **UNTUNED,
          GLIBC_TUNABLES="glibc.malloc.hugetlb=1")),
]
ENV_KEYS = ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT",
            "LD_PRELOAD", "MALLOC_CONF", "GLIBC_TUNABLES", "RETORT_PROCESS_TUNING",
            "RETORT_ALLOCATOR", "RETORT_PRELOADED"] + list(GLIBC_TUNED)


def run(command, env_extra):
    env = clean_environment()
    for key in ENV_KEYS:
        env.pop(key, None)
    env.update(env_extra)
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("json: "):
            return json.loads(line[len("json: "):])
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no result from " + " ".join(command) + ":\n" + out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=0,
                   help="after the rounds, this many back-to-back runs of Retort's defaults and "
                        "PyTorch at its best setting (information; the headline stays best of "
                        "the rounds)")
    a = p.parse_args()
    retort = [os.path.join(a.build, "bench", "bench_throughput"), str(a.steps), str(a.threads)]
    retort += MODEL_KEYS
    torch_loop = ["/usr/bin/python3", os.path.join(HERE, "torch_llama.py"), "--steps",
                  str(a.steps), "--threads", str(a.threads)]
    # Rounds are the outer loop: every round measures every setting, Retort and PyTorch back to
    # back (which goes first alternates by round), so each row samples the same phases of this
    # machine, whose speed drifts by 20% or more over minutes.
    runs = {name: ([], []) for name, _ in SETTINGS}
    for round_index in range(a.rounds):
        for name, env in SETTINGS:
            retort_runs, torch_runs = runs[name]
            if round_index % 2 == 0:
                retort_runs.append(run(retort, env))
                torch_runs.append(run(torch_loop, env))
            else:
                torch_runs.append(run(torch_loop, env))
                retort_runs.append(run(retort, env))
        print(f"  round {round_index + 1} of {a.rounds} measured", file=sys.stderr)
    best = lambda results: max(results, key=lambda result: result["tokens_per_s"])
    rows = [(name, best(runs[name][0]), best(runs[name][1])) for name, _ in SETTINGS]

    print(f"{a.threads} thread(s), {a.rounds} alternating round(s) of {a.steps} steps each, best "
          "of the rounds; MFU against Retort's fp32 GEMM peak with the same threads")
    if describe_removed():
        print(describe_removed())
    print("| setting | PyTorch tok/s | Retort tok/s | ratio | PyTorch MFU | Retort MFU | "
          "Retort fwd / bwd / optim s |")
    print("|---|---|---|---|---|---|---|")
    for name, r, t in rows:
        peak = r["gemm_peak_gflops"] * 1e9
        torch_mfu = t["tokens_per_s"] * r["flops_per_token"] / peak
        print(f"| {name} | {t['tokens_per_s']:.0f} | {r['tokens_per_s']:.0f} | "
              f"{r['tokens_per_s'] / t['tokens_per_s']:.2f} | {100 * torch_mfu:.0f}% | "
              f"{100 * r['mfu']:.0f}% | {r['forward_s']:.2f} / {r['backward_s']:.2f} / "
              f"{r['optimizer_s']:.2f} |")
    defaults = rows[0]
    best_setting = max(rows[1:], key=lambda row: row[1]["tokens_per_s"])
    print(f"\nAllocator for Retort: best measured is '{best_setting[0]}' "
          f"({best_setting[1]['tokens_per_s']:.0f} tok/s); Retort's defaults (jemalloc preloaded, "
          f"freed pages kept, huge pages asked; OpenMP passive after 10000 spins; OpenBLAS idle spin 2^10 cycles) give {defaults[1]['tokens_per_s']:.0f} tok/s")
    best_torch_row = max(rows, key=lambda row: row[2]["tokens_per_s"])
    best_torch = best_torch_row[2]["tokens_per_s"]
    print(f"Retort with its defaults: {defaults[1]['tokens_per_s']:.0f} tok/s = "
          f"{defaults[1]['tokens_per_s'] / best_torch:.2f}x PyTorch at its best setting "
          f"('{best_torch_row[0]}', {best_torch:.0f} tok/s), "
          f"{defaults[1]['tokens_per_s'] / defaults[2]['tokens_per_s']:.2f}x PyTorch with its "
          "defaults")
    # The same comparison within each round, where both ran minutes apart in the same phase.
    torch_best_name = best_torch_row[0]
    per_round = [r["tokens_per_s"] / t["tokens_per_s"]
                 for r, t in zip(runs[SETTINGS[0][0]][0], runs[torch_best_name][1])]
    print("Per round (Retort defaults / PyTorch at that setting, same round): " +
          ", ".join(f"{ratio:.2f}x" for ratio in per_round) +
          f"; median {sorted(per_round)[len(per_round) // 2]:.2f}x")
    # The step's matrix products alone, back to back through the same BLAS (best of the runs):
    # the tokens/s no engine calling that BLAS exceeds, whatever it does around them.
    floor_s = min(row[1]["products_floor_s"] for row in rows)
    ceiling = defaults[1]["tokens_per_s"] * defaults[1]["step_s"] / floor_s
    print(f"The step's matrix products alone take {floor_s:.3f} s through this BLAS: no engine "
          f"calling it exceeds {ceiling:.0f} tok/s = {ceiling / best_torch:.2f}x PyTorch at its "
          f"best; Retort reaches {defaults[1]['tokens_per_s'] / ceiling:.0%} of that ceiling, "
          f"PyTorch {best_torch / ceiling:.0%}")

    # Back to back, seconds apart rather than minutes: the rounds' per-round ratios pair runs
    # that sit minutes apart, through phases of this machine that move speeds by 10-20%.
    if a.pairs > 0:
        best_env = dict(SETTINGS)[torch_best_name]
        ratios = []
        for i in range(a.pairs):
            if i % 2 == 0:
                r, t = run(retort, SETTINGS[0][1]), run(torch_loop, best_env)
            else:
                t, r = run(torch_loop, best_env), run(retort, SETTINGS[0][1])
            ratios.append(r["tokens_per_s"] / t["tokens_per_s"])
        print(f"Back-to-back pairs (Retort defaults / PyTorch at '{torch_best_name}', order "
              "alternating): " + ", ".join(f"{x:.2f}x" for x in ratios) +
              f"; median {sorted(ratios)[len(ratios) // 2]:.2f}x")


if __name__ == "__main__":
    main()
