#!/usr/bin/env bash
# tools/setup.sh: installs what Retort needs to build, test and run on Debian 12:
#  - Debian packages (compilers, MPI, HDF5, yaml-cpp, GoogleTest, ...);
#  - a Python environment in .venv (ignored by git), pinned whole by tools/requirements.txt:
#    the PyPI torch wheel, whose libtorch (headers, libraries, TorchConfig.cmake) Retort
#    builds on, and the outside references the tests compare against (transformers,
#    tokenizers, safetensors, tensorboard, h5py, sentencepiece).
# Idempotent: what is present is skipped, so a second run costs a second. Nothing is
# downloaded later, at build or test time. RETORT_VENV names another environment folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libopenmpi-dev openmpi-bin
  libhdf5-dev
  libyaml-cpp-dev
  libgtest-dev
  libboost-program-options-dev
  nlohmann-json3-dev
  # the Python environment below is made by Debian's Python, so it does not depend on pyenv
  python3 python3-venv
  # the allocators the process set-up and bench/peer compare
  libjemalloc2 libtcmalloc-minimal4
  # tokenizers: PCRE2 for tokenizer.json's Unicode regex; SentencePiece (the trainer too)
  libpcre2-dev libicu-dev libsentencepiece-dev sentencepiece
  # simulated hosts for the multi-host tests (tools/sim_hosts.sh: ip netns, tc; unshare)
  iproute2 util-linux
  # tests/fuzz: libFuzzer targets built with clang (ASan, UBSan, libFuzzer's runtime)
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python environment, rebuilt whenever tools/requirements.txt changes (its hash is kept
# beside it), so a checkout always builds and tests against the pins it carries.
venv="${RETORT_VENV:-$root/.venv}"
requirements="$root/tools/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing the Python environment in $venv (tools/requirements.txt)"
  /usr/bin/python3 -m venv --clear "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
  echo "$want" > "$stamp"
else
  echo "setup: Python environment $venv up to date"
fi
