"""bench/peer/run_peer.py: Retort against PyTorch 2.11 training the same Llama on this machine,
in one invocation. The model is issue 12's (hidden 512, 8 layers, 8 heads, 8 kv heads, ffn
1536, vocab 32000 tied, sequence 256, micro-batch 4, AdamW). The programs:
  - Retort on this build's libtorch 2.11 (bench_throughput, fp32);
  - Retort's last build on Debian's libtorch 1.13 (bench_throughput of that build, fp32),
    with --retort-113 PATH (bench/peer/build_113.sh builds it);
  - PyTorch 2.11 eager fp32 with scaled_dot_product_attention, the same under bf16
    autocast, and the fp32 model through torch.compile (bench/peer/torch_llama.py).
Each round runs every program under every environment setting, the programs' order rotating
by round, so each cell samples the same phases of this machine; the table holds the best
tokens/s of the rounds, and each program's ratio to Retort 2.11 per round and their median.

With --precision bf16 the programs are Retort in bf16 (model.dtype=bfloat16, the one the others
are compared with), Retort in fp32, PyTorch eager under bf16 autocast and torch.compile under
bf16 autocast.

Usage: tools/python bench/peer/run_peer.py [--build build] [--retort-113 PATH] [--rounds 2]
         [--steps 5] [--threads 2] [--settings defaults,best | all] [--precision fp32 | bf16]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_env import clean_environment, describe_removed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_KEYS = ["model.hidden=512", "model.layers=8", "model.heads=8", "model.kv_heads=8",
              "model.ffn_hidden=1536"]
# glibc refuses an mmap threshold above 32 MB (HEAP_MAX_SIZE / 2) on 64-bit.
GLIBC_TUNED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 25), "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
               "MALLOC_TOP_PAD_": str(1 << 28)}
PASSIVE = {"OMP_WAIT_POLICY": "passive"}
# libgomp's idle workers spin 10000 times (about 0.1 ms), not 0, before sleeping (Retort's
# default with passive).
OMP_SHORT_SPIN = {"GOMP_SPINCOUNT": "10000"}
# OpenBLAS's idle workers spin 2^10 cycles, not 2^28: read by the 1.13 build's OpenBLAS only
# (the 2.11 programs run MKL on OpenMP's threads).
BLAS_SHORT_SPIN = {"OPENBLAS_THREAD_TIMEOUT": "10"}
LIB = "/usr/lib/x86_64-linux-gnu/"
# Retort's own set-up (allocator, passive OpenMP) is off where another setting is measured.
UNTUNED = {"RETORT_PROCESS_TUNING": "0"}
SETTINGS = [  # (name, environment of every program); the first is nobody's settings
    ("defaults", {}),
    ("glibc tuned + OMP passive", dict(GLIBC_TUNED, **PASSIVE, RETORT_ALLOCATOR="glibc")),
    ("glibc untuned + OMP passive", dict(PASSIVE, **UNTUNED)),
    ("jemalloc (no decay) + OMP passive",
     dict(PASSIVE, **UNTUNED, LD_PRELOAD=LIB + "libjemalloc.so.2",
          MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1")),
    ("tcmalloc + OMP passive, short spin",
     dict(PASSIVE, **OMP_SHORT_SPIN, **BLAS_SHORT_SPIN, **UNTUNED,
          LD_PRELOAD=LIB + "libtcmalloc_minimal.so.4")),
    # Transparent huge pages on request (the kernel's mode here is madvise): Retort's default
    # asks for them through jemalloc, so PyTorch is offered them too, through either allocator.
    ("jemalloc (no decay, huge pages) + OMP passive, short spin",
     dict(PASSIVE, **OMP_SHORT_SPIN, **BLAS_SHORT_SPIN, **UNTUNED,
          LD_PRELOAD=LIB + "libjemalloc.so.2",
          MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1,thp:always")),
    ("glibc tuned + huge pages + OMP passive, short spin",
     dict(GLIBC_TUNED, **PASSIVE, **OMP_SHORT_SPIN, **BLAS_SHORT_SPIN, **UNTUNED,
          GLIBC_TUNABLES="glibc.malloc.hugetlb=1")),
]
# --settings defaults,best: nobody's settings and the one PyTorch ran fastest under so far.
SHORT_LIST = ["defaults", "jemalloc (no decay, huge pages) + OMP passive, short spin"]
# torch.compile's kernels, compiled afresh by each invocation (a cache left by another
# torch build or environment once failed to load: an undefined Sleef symbol).
INDUCTOR_CACHE = tempfile.mkdtemp(prefix="run_peer_inductor_")
ENV_KEYS = ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT",
            "LD_PRELOAD", "MALLOC_CONF", "GLIBC_TUNABLES", "RETORT_PROCESS_TUNING",
            "RETORT_ALLOCATOR", "RETORT_PRELOADED"] + list(GLIBC_TUNED)


def run(command, env_extra):
    env = clean_environment()
    for key in ENV_KEYS:
        env.pop(key, None)
    env.update(env_extra)
    env["TORCHINDUCTOR_CACHE_DIR"] = INDUCTOR_CACHE
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("json: "):
            return json.loads(line[len("json: "):])
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no result from " + " ".join(command) + ":\n" + out)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--retort-113", default="",
                   help="bench_throughput of Retort's last build on Debian's libtorch 1.13")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settings", default="defaults,best", choices=["defaults,best", "all"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = p.parse_args()
    retort_args = [str(a.steps), str(a.threads)] + MODEL_KEYS
    torch_loop = [sys.executable, os.path.join(HERE, "torch_llama.py"), "--steps", str(a.steps),
                  "--threads", str(a.threads), "--mode"]
    programs = [("Retort, libtorch 2.11", [os.path.join(a.build, "bench", "bench_throughput")] +
                 retort_args)]
    if a.retort_113:
        programs.append(("Retort, libtorch 1.13", [a.retort_113] + retort_args))
    if a.precision == "bf16":
        programs = [("Retort bf16", programs[0][1] + ["model.dtype=bfloat16"]),
                    ("Retort fp32", programs[0][1]),
                    ("PyTorch 2.11 eager bf16 autocast", torch_loop + ["bf16"]),
                    ("PyTorch 2.11 torch.compile bf16 autocast", torch_loop + ["compiled_bf16"])]
    else:
        programs += [("PyTorch 2.11 eager fp32", torch_loop + ["eager"]),
                     ("PyTorch 2.11 eager bf16 autocast", torch_loop + ["bf16"]),
                     ("PyTorch 2.11 torch.compile fp32", torch_loop + ["compiled"])]
    settings = SETTINGS if a.settings == "all" else [s for s in SETTINGS if s[0] in SHORT_LIST]

    results = {(s, name): [] for s, _ in settings for name, _ in programs}
    for round_index in range(a.rounds):
        order = programs[round_index % len(programs):] + programs[:round_index % len(programs)]
        for setting, env in settings:
            for name, command in order:
                results[(setting, name)].append(run(command, env))
        print(f"  round {round_index + 1} of {a.rounds} measured", file=sys.stderr)

    print(f"{a.threads} thread(s), {a.rounds} round(s) of {a.steps} steps per program and "
          "setting; tokens/s, best of the rounds")
    if describe_removed():
        print(describe_removed())
    print("| setting | " + " | ".join(name for name, _ in programs) + " |")
    print("|---|" + "---|" * len(programs))
    for setting, _ in settings:
        best = [max(r["tokens_per_s"] for r in results[(setting, name)]) for name, _ in programs]
        print(f"| {setting} | " + " | ".join(f"{b:.0f}" for b in best) + " |")

    ours = programs[0][0]
    defaults = settings[0][0]
    print(f"\n{ours} with its defaults against each program at each one's best setting "
          "(ratio per round, then the median):")
    for name, _ in programs[1:]:
        best_setting = max((s for s, _ in settings),
                           key=lambda s: max(r["tokens_per_s"] for r in results[(s, name)]))
        ratios = [r["tokens_per_s"] / t["tokens_per_s"]
                  for r, t in zip(results[(defaults, ours)], results[(best_setting, name)])]
        print(f"  vs {name} ('{best_setting}'): " + ", ".join(f"{x:.2f}x" for x in ratios) +
              f"; median {median(ratios):.2f}x")
    mfu = [r["mfu"] for r in results[(defaults, ours)]]
    print(f"{ours} MFU against its fp32 GEMM peak with the same threads: "
          + ", ".join(f"{100 * m:.0f}%" for m in mfu))


if __name__ == "__main__":
    main()
