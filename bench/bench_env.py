"""bench/bench_env.py: the environment the benchmark drivers give the programs they time.

Measured "defaults" mean nothing set. Some platforms set OpenBLAS variables for every
process: this machine kind's sets OPENBLAS_CORETYPE=Haswell (and OPENBLAS_L2_SIZE), which
holds OpenBLAS to its AVX2 kernels on a Zen 5 that runs its AVX-512 ones, at about half the
speed for fp32 products. The drivers remove them, so both Retort and PyTorch run with the
kernels OpenBLAS picks itself, and print what they removed."""
import os

PLATFORM_OVERRIDES = ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"]


def clean_environment(extra=None):
    """os.environ without the platform's OpenBLAS overrides, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in PLATFORM_OVERRIDES}
    env.update(extra or {})
    return env


def describe_removed():
    """One line naming the overrides this process's environment had, or an empty string."""
    removed = [f"{k}={os.environ[k]}" for k in PLATFORM_OVERRIDES if k in os.environ]
    return ("removed from the programs' environment (OpenBLAS then picks its kernels itself): "
            + ", ".join(removed)) if removed else ""
