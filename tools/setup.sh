#!/usr/bin/env bash
# tools/setup.sh: installs the Debian 12 packages Retort needs to build, test and run.
# Idempotent: packages already present are skipped, so a second run costs a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-pthread
  libopenmpi-dev openmpi-bin
  libhdf5-dev
  libyaml-cpp-dev
  libgtest-dev
  libboost-program-options-dev
  nlohmann-json3-dev
  python3-matplotlib
  # bench/peer: the PyTorch loop Retort is measured against, and the allocators it compares
  python3-torch libjemalloc2 libtcmalloc-minimal4
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
