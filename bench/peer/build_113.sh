#!/usr/bin/env bash
# bench/peer/build_113.sh [OUT_DIR]: builds bench_throughput of Retort's last commit on
# Debian's libtorch 1.13 (c6b1712, before the move to the PyPI wheel), against Debian's
# libtorch-dev and OpenBLAS, which it installs if missing, into OUT_DIR (default
# build-113/), for bench/peer/run_peer.py --retort-113 OUT_DIR/build/bench/bench_throughput.
# Nothing of it is used by the build or the tests.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(realpath -m "${1:-$root/build-113}")"
commit=c6b1712
need=()
for p in libtorch-dev libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ ! -f "$out/src/CMakeLists.txt" ]; then
  mkdir -p "$out/src"
  git -C "$root" archive "$commit" | tar -x -C "$out/src"
fi
cmake -S "$out/src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRETORT_TESTS=OFF >/dev/null
ninja -C "$out/build" bench_throughput
echo "$out/build/bench/bench_throughput"
