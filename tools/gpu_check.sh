#!/usr/bin/env bash
# tools/gpu_check.sh: the GPU acceptance run (issue 46), for a machine with NVIDIA GPUs,
# PyTorch 2.11 (CUDA 13.0) in its python3, and no network: no MPI, HDF5, yaml-cpp or Boost.
#
#   tools/gpu_check.sh --pack DIR   here: the binaries built here (build/, or $RETORT_BUILD),
#                                   the test corpus, and every library they and OpenMPI need
#                                   beyond glibc, libstdc++ and PyTorch's own, into
#                                   DIR/retort-gpu-pack.tar.xz (at most 60 MiB)
#   tools/gpu_check.sh [--from DIR] there: unpacks DIR's pack (default gpu_pack/) and runs the
#                                   sequence below on the GPU
#   tools/gpu_check.sh --list       the steps, each with its estimate on one H100
#   tools/gpu_check.sh --step A,B   only those steps (with --from or --dry-run too)
#   tools/gpu_check.sh --dry-run [--from DIR]
#                                   here: the same sequence on the CPU from the pack, in a
#                                   private mount namespace where /dev/null hides the system's
#                                   copy of every packed library and OpenMPI's programs, so
#                                   what the pack lacks fails here, not there
#
# Binaries built here rather than a build there: that machine's PyTorch is the same 2.11.0
# (CUDA 13.0) as this build's, so the binaries run against it unchanged; a build there would
# need the headers and CMake packages of MPI, HDF5, yaml-cpp, Boost and GoogleTest carried
# as well, and minutes of the 8 the check may take. The packed libraries are Debian 12's and
# need glibc 2.36 or newer there.
#
# The sequence, in steps (--list), each one or more rows of the summary: printed, and with OUT
# set appended to $OUT/gpu_check.md, its logs copied to $OUT/logs, as each step ends. Whether
# the pack's programs load there; the CUDA unit tests; the communicator on the device with one
# rank and two (the second with two GPUs), NCCL on one rank included; the consistency layouts
# TP1/TP2/STP2/PP2 in fp32 (TF32 off, against TP1 run on the CPU) and in bf16; a bf16
# distillation of 50 steps whose loss must fall; greedy generation on the device against the
# CPU's; bench_throughput in bf16 against PyTorch eager under bf16 autocast on the same
# model (TinyLlama's shape, sequence 2048, on the GPU; a small shape on the CPU), MFU against
# the device's peak; bench_memory. Exit status 1 when a row failed.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pack_name=retort-gpu-pack
max_pack_bytes=$((60 * 1024 * 1024))
mode=run
from="$here/gpu_pack"
step_names=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pack)
      [[ $# -ge 2 && -n "$2" && "$2" != -* ]] || { echo "error: gpu_check.sh: --pack needs a folder (tools/gpu_check.sh --pack DIR)" >&2; exit 2; }
      mode=pack; from="$2"; shift 2 ;;
    --dry-run) mode=dry-run; shift ;;
    --from) from="${2:?--from needs a folder}"; shift 2 ;;
    --step)
      [[ $# -ge 2 && -n "$2" && "$2" != -* ]] || { echo "error: gpu_check.sh: --step needs a step name or a comma-separated list (see --list)" >&2; exit 2; }
      step_names="$2"; shift 2 ;;
    --list) mode=list; shift ;;
    --inside-namespace) mode=inside; shift ;;  # the dry run, re-entered (internal)
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "error: gpu_check.sh: $*" >&2; exit 2; }

# The steps, in order: name, the seconds it is expected to take on one H100 (an estimate from
# the work it does: process and CUDA start-up dominate all but throughput and memory), and what
# it checks. Each runs within a budget of twice its estimate (at most 4 minutes) and is killed
# past it; the dry run on a CPU allows each 15 minutes.
step_table=(
  "load 5 the pack's programs load (libraries, glibc)"
  "cuda_unit 60 CUDA unit tests (placement, offloading, generation, NCCL, device peak, head)"
  "nccl 20 the communicator on the device, 1 rank (and 2 with two GPUs)"
  "consistency_float32 45 TP1/TP2/STP2/PP2 on the device against TP1 on the CPU, fp32 (TF32 off)"
  "consistency_bfloat16 50 TP1/TP2/STP2/PP2 in bf16 on the device (and TP1 in float64)"
  "distill 40 bf16 distillation, 50 steps: the loss falls"
  "generate 25 greedy generation on the device gives the CPU's tokens"
  "throughput 70 bench_throughput bf16 at TinyLlama's shape, MFU against the device's peak"
  "pytorch_eager 50 PyTorch eager bf16 autocast on the same model"
  "memory 60 bench_memory (offloading) on the device"
)
step_budget_of() {
  local entry name estimate
  for entry in "${step_table[@]}"; do
    read -r name estimate _ <<<"$entry"
    if [[ "$name" == "$1" ]]; then
      if [[ "$mode" == inside ]]; then echo 900; else echo $((2 * estimate < 240 ? 2 * estimate : 240)); fi
      return
    fi
  done
}
all_steps=()
for entry in "${step_table[@]}"; do all_steps+=("${entry%% *}"); done
if [[ "$mode" == list ]]; then
  total=0
  printf '%-21s %-22s %s\n' step "estimate on one H100" checks
  for entry in "${step_table[@]}"; do
    read -r name estimate what <<<"$entry"
    printf '%-21s %-22s %s\n' "$name" "${estimate} s" "$what"
    total=$((total + estimate))
  done
  printf '%-21s %-22s %s\n' all "${total} s" "the default: every step in this order"
  exit 0
fi
selected=("${all_steps[@]}")
if [[ -n "$step_names" ]]; then
  IFS=, read -r -a selected <<<"$step_names"
  for name in "${selected[@]}"; do
    [[ " ${all_steps[*]} " == *" $name "* ]] || die "--step: no step named '$name' (the steps: ${all_steps[*]})"
  done
fi

# ---------------------------------------------------------------------------------------------
# --pack
# ---------------------------------------------------------------------------------------------
binaries=(tools/engine_train tools/engine_consistency tools/engine_prepare_data
          tools/engine_generate bench/bench_throughput bench/bench_memory tests/unit_torch_tests
          tests/mpi_tests)

# Libraries that machine has: glibc's, the C++ runtime, and what PyTorch's wheel and its
# nvidia-* packages bring (found there through python3).
is_provided() {
  case "$(basename "$1")" in
    linux-vdso.so.*|ld-linux-x86-64.so.*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*) return 0 ;;
    librt.so.*|libutil.so.*|libresolv.so.*|libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  case "$1" in
    */site-packages/torch/*|*/site-packages/nvidia/*|/usr/local/cuda*) return 0 ;;
  esac
  return 1
}

# Every library path ldd resolves for the files given, one per line, those provided excepted.
needed_libraries() {
  local f
  for f in "$@"; do
    ldd "$f" 2>/dev/null | awk '/=> \// { print $3 }'
  done | sort -u | while read -r lib; do is_provided "$lib" || echo "$lib"; done
}

make_pack() {
  local out="$1" build="${RETORT_BUILD:-build}"
  [[ "$build" == /* ]] || build="$here/$build"
  for b in "${binaries[@]}"; do
    [[ -x "$build/$b" ]] || die "--pack: $build/$b is missing; build first (cmake --build build)"
  done
  [[ -f "$build/test_data/sotu_bytes.bin" ]] ||
    die "--pack: the test corpus $build/test_data/sotu_bytes.bin is missing; run ctest once"
  mkdir -p "$out" || die "--pack: cannot create $out"
  local stage
  stage="$(mktemp -d)" || die "--pack: no temporary folder"
  local root="$stage/$pack_name"
  mkdir -p "$root/bin" "$root/lib" "$root/data"
  for b in "${binaries[@]}"; do
    cp "$build/$b" "$root/bin/" && strip --strip-unneeded "$root/bin/$(basename "$b")"
  done
  cp "$build"/test_data/sotu_bytes.* "$root/data/"
  # OpenMPI, laid out as Debian installs it under its prefix, so OPAL_PREFIX relocates it.
  local ompi="$root/ompi" plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
  mkdir -p "$ompi/bin" "$ompi/lib/x86_64-linux-gnu/openmpi/lib" "$ompi/share" "$ompi/etc"
  cp "$(readlink -f /usr/bin/mpirun)" "$ompi/bin/orterun"
  ln -s orterun "$ompi/bin/mpirun"
  cp "$(readlink -f /usr/bin/orted)" "$ompi/bin/orted"
  # The components a run on one host loads; InfiniBand, UCX and libfabric ones are left out
  # (their libraries are large and that machine has none of the hardware).
  mkdir -p "$ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"
  local component
  for component in "$plugins"/*.so; do
    case "$(basename "$component")" in
      *openib*|*ucx*|*ofi*|*psm*|*verbs*|*portals*|*usnic*|*ucc*|*hcoll*|*fca*) continue ;;
    esac
    cp "$component" "$ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/"
  done
  cp -r /usr/share/openmpi "$ompi/share/"
  cp /etc/openmpi/* "$ompi/etc/" 2>/dev/null
  # Every library the binaries, mpirun and the kept components need, dereferenced, under the
  # names the loader asks for.
  local lib
  needed_libraries "$root"/bin/* "$ompi"/bin/orterun "$ompi"/bin/orted \
    "$ompi"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so |
    while read -r lib; do cp -L "$lib" "$root/lib/$(basename "$lib")"; done
  strip --strip-unneeded "$root"/lib/*.so* 2>/dev/null
  {
    echo "packed $(date -u +%Y-%m-%dT%H:%MZ) from $(git -C "$here" rev-parse --short HEAD 2>/dev/null)"
    echo "torch $("$here/tools/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
    echo "libraries: $(ls "$root/lib" | wc -l), OpenMPI components: $(ls "$ompi"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 | wc -l)"
  } >"$root/MANIFEST"
  local tarball="$out/$pack_name.tar.xz"
  tar -C "$stage" -cJf "$tarball" "$pack_name" || die "--pack: tar failed"
  rm -rf "$stage"
  local bytes
  bytes=$(stat -c %s "$tarball")
  echo "gpu_check: packed $tarball: $((bytes / 1024 / 1024)) MiB ($bytes bytes)"
  if ((bytes > max_pack_bytes)); then
    rm -f "$tarball"
    die "--pack: the pack is $bytes bytes, over the 60 MiB a device call carries"
  fi
}

if [[ "$mode" == pack ]]; then
  make_pack "$from"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# The run (GPU) and the dry run (CPU)
# ---------------------------------------------------------------------------------------------
if [[ "$mode" == dry-run ]]; then
  # Re-enter in a private mount namespace that hides the system's copy of each packed library.
  command -v unshare >/dev/null || die "--dry-run needs unshare (util-linux)"
  exec unshare -m --propagation private "$BASH" "${BASH_SOURCE[0]}" --inside-namespace --from "$from" \
    ${step_names:+--step "$step_names"}
fi

tarball="$from/$pack_name.tar.xz"
[[ -f "$tarball" ]] || die "no pack at $tarball (make one here with tools/gpu_check.sh --pack DIR)"
work="$(mktemp -d "${TMPDIR:-/tmp}/retort_gpu_check.XXXXXX")" || die "no temporary folder"
tar -C "$work" -xJf "$tarball" || die "cannot unpack $tarball"
pack="$work/$pack_name"
step_pid=""
trap 'rm -rf "$work"' EXIT
# Cut off (TERM, INT): the running step's command is stopped too (timeout passes the signal on).
trap '[[ -n "$step_pid" ]] && kill -TERM "$step_pid" 2>/dev/null; exit 143' TERM INT

if [[ "$mode" == inside ]]; then
  device=cpu
  python="$here/tools/python"
  # Every library the packed programs need beyond what that machine provides, as this machine
  # resolves it (so one missing from the pack is hidden too), and this machine's copy of each
  # packed one.
  # The whole list first: once one is hidden, ldd stops resolving what depends on it.
  mapfile -t to_hide < <(
    needed_libraries "$pack"/bin/* "$pack"/ompi/bin/orterun "$pack"/ompi/bin/orted \
      "$pack"/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so
    for lib in "$pack"/lib/*; do
      echo "/usr/lib/x86_64-linux-gnu/$(basename "$lib")"
    done
  )
  # From here on this shell's own tools (mount, grep) find the hidden libraries in the pack.
  export LD_LIBRARY_PATH="$pack/lib"
  hidden=0
  declare -A seen
  for system in "${to_hide[@]}"; do
    real="$(readlink -f "$system" 2>/dev/null)"
    [[ -n "$real" && -e "$real" && -z "${seen[$real]:-}" ]] || continue
    seen[$real]=1
    mount --bind /dev/null "$real" 2>/dev/null && hidden=$((hidden + 1))
  done
  for program in /usr/bin/orterun /usr/bin/orted /usr/bin/mpirun /usr/bin/mpiexec; do
    real="$(readlink -f "$program" 2>/dev/null)"
    [[ -e "$real" ]] && mount --bind /dev/null "$real" 2>/dev/null
  done
  mount --bind "$work" /usr/lib/x86_64-linux-gnu/openmpi 2>/dev/null
  echo "gpu_check: dry run on the CPU; $hidden system libraries hidden"
  # A rehearsal of the sequence, not a CPU benchmark: bf16 products widened to float32 where the
  # CPU has no fast bf16 GEMM (layers/widened_products.h), or its bf16 steps take hours there.
  export RETORT_BF16_PRODUCTS="${RETORT_BF16_PRODUCTS:-auto}"
else
  device=cuda
  python=python3
fi

export LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # the dry run's python too
torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')" ||
  die "$python has no torch"
nvidia_libs="$("$python" -c 'import glob, os, torch; s = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(os.path.join(s, "nvidia", "*", "lib")))))' 2>/dev/null)"
gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$torch_lib:$nvidia_libs:/usr/local/cuda/lib64"
export OPAL_PREFIX="$pack/ompi" OPAL_SYSCONFDIR="$pack/ompi/etc"
export PATH="$pack/ompi/bin:$pack/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_btl="self,vader,tcp"
export NVIDIA_TF32_OVERRIDE=0  # fp32 products stay fp32 (cuBLAS, cuDNN)
export GTEST_COLOR=no
corpus="$pack/data/sotu_bytes"
results="$work/results"
mkdir -p "$results"
mpirun_cmd=(mpirun --bind-to none)

rows=()
# row NAME STATUS FIGURE SECONDS: prints the row and, with OUT set, appends it to
# $OUT/gpu_check.md at once, so a check cut off later keeps the rows of the steps it finished.
row() {
  rows+=("| $1 | $2 | $3 | $4 |")
  echo "gpu_check: $1: $2 ($3, $4 s)"
  [[ -n "${OUT:-}" ]] && echo "| $1 | $2 | $3 | $4 |" >>"$OUT/gpu_check.md"
}
# step NAME LOG COMMAND...: runs it within the current step's budget ($step_budget seconds:
# killed past it), returns its exit status; the log keeps its output and, with OUT set, is
# copied to $OUT/logs.
step() {
  local name="$1" log="$results/$2.log"
  shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$step_budget" "$@" >"$log" 2>&1 &
  step_pid=$!  # timeout leads a process group of its own: the TERM trap below reaches it by pid
  wait "$step_pid"
  local rc=$?
  step_pid=""
  ((rc == 124 || rc == 137)) && echo "error: $name ran past its budget of $step_budget s" >>"$log"
  step_seconds=$((SECONDS - start))
  step_log="$log"
  [[ -n "${OUT:-}" ]] && cp "$log" "$OUT/logs/" 2>/dev/null
  return $rc
}
# "N passed, M skipped" from a GoogleTest log.
gtest_counts() {
  local passed skipped
  passed=$(sed -n 's/.*PASSED .*\] *\([0-9]*\) test.*/\1/p' "$1" | head -1)
  skipped=$(sed -n 's/.*SKIPPED .*\] *\([0-9]*\) test.*/\1/p' "$1" | head -1)
  echo "${passed:-0} passed, ${skipped:-0} skipped (no GPU)" | sed 's/, 0 skipped (no GPU)//'
}
tail_reason() { tail -n 40 "$1" | grep -m1 -E "error|Error|FAILED|not built|abort" | cut -c1-140; }

# 0. The pack's programs load here: every library found, and the C library they were built
# against no newer than this machine's
step_load() {
  glibc="$(ldd --version 2>/dev/null | head -1 | grep -Eo '[0-9]+\.[0-9]+$')"
  unresolved="$(for program in "$pack"/bin/* "$pack"/ompi/bin/orterun; do ldd "$program" 2>&1; done |
    grep -E 'not found|version .GLIBC|too short|cannot open' |
    sed -E 's/^[[:space:]]*//; s|^.*/([^/:]*): error while loading shared libraries: .*/([^/:]*):|\1 needs \2:|' |
    sort -u | head -3 | tr '\n' ';')"
  if [[ -z "$unresolved" ]]; then
    row "the pack's programs load" ok "glibc ${glibc:-?}" 0
  else
    row "the pack's programs load" FAILED "glibc ${glibc:-?}: $unresolved" 0
  fi
}

# 1. CUDA unit tests (the tests that need a GPU skip themselves without one)
# (the placement tests train on the pack's corpus and the checkout's configs)
step_cuda_unit() {
  if step "CUDA unit tests" cuda_unit env RETORT_TEST_CORPUS="$corpus" RETORT_TEST_CONFIGS="$here/configs" \
      unit_torch_tests --gtest_filter='Cuda*:*OnCuda*:Nccl*' --gtest_brief=1; then
    row "CUDA unit tests" ok "$(gtest_counts "$step_log")" $step_seconds
  else
    row "CUDA unit tests" FAILED "$(tail_reason "$step_log")" $step_seconds
  fi
}

# 2. NCCL through the communicator: one rank, and two where two GPUs are present
step_nccl() {
  for ranks in 1 2; do
    if ((ranks == 2 && gpus < 2)) && [[ "$device" == cuda ]]; then
      row "NCCL, 2 ranks" skipped "one GPU" 0
      continue
    fi
    if step "NCCL, $ranks rank(s)" "nccl_$ranks" "${mpirun_cmd[@]}" -np $ranks mpi_tests --gtest_filter='DeviceCommunicator.*'; then
      row "communicator on $device, $ranks rank(s)" ok "$(gtest_counts "$step_log")" $step_seconds
    else
      row "communicator on $device, $ranks rank(s)" FAILED "$(tail_reason "$step_log")" $step_seconds
    fi
  done
}

# 3-4. Consistency layouts on the device: fp32 (TF32 off) against TP1 run on the CPU, and bf16
# against TP1 on the device (derived tolerances)
consistency_step() {
  local dtype=$1 layouts against
  layouts=TP1,TP2,STP2,PP2 against="TP1 on $device"
  [[ $dtype == float32 ]] && layouts=TP1@cpu,TP1,TP2,STP2,PP2 against="TP1 on the CPU"
  if step "consistency $dtype" "consistency_$dtype" "${mpirun_cmd[@]}" -np 4 engine_consistency \
      "$here/configs/consistency.yaml" "data.paths=[$corpus]" "model.dtype=$dtype" \
      "runtime.device=$device" --layouts "$layouts" --out "$results/consistency_$dtype"; then
    row "consistency ${layouts//,//} against $against, $dtype, $device" ok "$(grep -c '| yes |' "$step_log") layouts agree" $step_seconds
  else
    row "consistency ${layouts//,//} against $against, $dtype, $device" FAILED "$(tail_reason "$step_log")" $step_seconds
  fi
}
step_consistency_float32() { consistency_step float32; }
step_consistency_bfloat16() { consistency_step bfloat16; }

# 5. bf16 distillation, 50 steps (the consistency suite's self-contained student and teacher):
# the loss must fall
step_distill() {
  run_dir="$results/distill_bf16"
  if step "distill bf16" distill_bf16 engine_train "$here/configs/consistency_distill.yaml" \
      "data.paths=[$corpus]" model.dtype=bfloat16 "runtime.device=$device" runtime.threads=0 \
      training.steps=50 training.eval_every=0 training.log_every=1 checkpoint.save_at_end=false \
      "run.dir=$run_dir"; then
    losses="$("$python" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "loss" in r and "step" in r]
print("%.3f %.3f" % (rows[0]["loss"], rows[-1]["loss"]))' "$run_dir/metrics.jsonl" 2>/dev/null)"
    first="${losses% *}" last="${losses#* }"
    if [[ -n "$losses" ]] && "$python" -c "import sys; sys.exit(0 if $last < $first else 1)"; then
      row "distillation bf16, 50 steps, $device" ok "loss $first -> $last" $step_seconds
    else
      row "distillation bf16, 50 steps, $device" FAILED "loss did not fall: ${losses:-no metrics}" $step_seconds
    fi
  else
    row "distillation bf16, 50 steps, $device" FAILED "$(tail_reason "$step_log")" $step_seconds
  fi
}

# 5b. Generation on the device: a student trained 4 steps (fp32) continues a prompt greedily
# with the same tokens on the device as on the CPU
step_generate() {
  gen_dir="$results/generate_run"
  if step "generate" generate engine_train "$here/configs/tiny.yaml" "data.paths=[$corpus]" \
      "runtime.device=$device" training.steps=4 training.eval_every=0 checkpoint.save_at_end=true \
      "run.dir=$gen_dir" &&
     step "generate" generate_cpu engine_generate "$gen_dir" --prompt "The state of" \
      --max-tokens 24 --temperature 0 --tokenizer bytes --device cpu &&
     cp "$step_log" "$results/generate_cpu.out" &&
     step "generate" generate_device engine_generate "$gen_dir" --prompt "The state of" \
      --max-tokens 24 --temperature 0 --tokenizer bytes --device "$device"; then
    if cmp -s <(grep -v '^engine_generate:' "$results/generate_cpu.out") \
              <(grep -v '^engine_generate:' "$step_log"); then
      row "engine_generate greedy, $device against the CPU" ok "24 tokens alike" $step_seconds
    else
      row "engine_generate greedy, $device against the CPU" FAILED "the texts differ" $step_seconds
    fi
  else
    row "engine_generate greedy, $device against the CPU" FAILED "$(tail_reason "$step_log")" $step_seconds
  fi
}

# 6. Throughput in bf16 against PyTorch eager (bf16 autocast, SDPA) on the same model:
# TinyLlama's shape on the GPU, a small one on the CPU
if [[ "$device" == cuda ]]; then
  shape=(hidden=2048 layers=22 heads=32 kv_heads=4 ffn_hidden=5632 seq=2048 batch=4 steps=5)
else
  shape=(hidden=256 layers=2 heads=4 kv_heads=2 ffn_hidden=688 seq=128 batch=2 steps=2)
fi
declare -A s
for kv in "${shape[@]}"; do s[${kv%%=*}]=${kv#*=}; done
retort_tps=""
# MFU as bench_throughput reports it: against the device's dense bf16 peak on the GPU
# (engine/observe/device_peak.h), against the best fp32 GEMM on the CPU.
step_throughput() {
  local keys=("model.hidden=${s[hidden]}" "model.layers=${s[layers]}" "model.heads=${s[heads]}"
              "model.kv_heads=${s[kv_heads]}" "model.ffn_hidden=${s[ffn_hidden]}"
              "data.seq_len=${s[seq]}" "training.micro_batch=${s[batch]}"
              "training.global_batch=${s[batch]}" model.dtype=bfloat16 "runtime.device=$device")
  local name="Retort bf16, ${s[hidden]}x${s[layers]}, seq ${s[seq]}, $device" mfu how
  if step "bench_throughput" throughput bench_throughput "${s[steps]}" "$(nproc)" "${keys[@]}"; then
    IFS=$'\t' read -r retort_tps mfu how < <("$python" -c '
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("json: ")][-1]
r = json.loads(line[6:])
print("%d\t%.1f\t%s" % (round(r["tokens_per_s"]), 100 * r["mfu"], r["peak_how"]))' "$step_log")
    row "$name" ok "$retort_tps tokens/s, MFU $mfu% ($how)" $step_seconds
  else
    retort_tps=""
    row "$name" FAILED "$(tail_reason "$step_log")" $step_seconds
  fi
}

step_pytorch_eager() {
  local name="PyTorch eager bf16 autocast, same model, $device" torch_tps ratio=""
  if step "pytorch eager" pytorch_eager "$python" "$here/bench/peer/torch_llama.py" --mode bf16 \
      --device "$device" --hidden "${s[hidden]}" --layers "${s[layers]}" --heads "${s[heads]}" \
      --kv_heads "${s[kv_heads]}" --ffn "${s[ffn_hidden]}" --seq "${s[seq]}" --batch "${s[batch]}" \
      --steps "${s[steps]}" --threads "$(nproc)"; then
    torch_tps="$("$python" -c 'import json,sys; print(round(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["tokens_per_s"]))' "$step_log")"
    if [[ -n "$retort_tps" ]]; then
      ratio="; Retort $("$python" -c "print(f'{$retort_tps / $torch_tps:.2f}x')")"
    fi
    row "$name" ok "$torch_tps tokens/s$ratio" $step_seconds
  else
    row "$name" FAILED "$(tail -n1 "$step_log" | cut -c1-140)" $step_seconds
  fi
}

# 7. Memory with offloading
step_memory() {
  # The dry run rehearses the step at a quarter of the sequence (the GPU's shapes take minutes
  # on a CPU); the models, variants and rows are the same.
  local shorter=()
  [[ "$device" == cpu ]] && shorter=(data.seq_len=64)
  if step "bench_memory" memory bench_memory 1 "$(nproc)" "runtime.device=$device" "${shorter[@]}"; then
    peaks="$(awk -F'|' '/\| LM 39.6M \| baseline/ {b=$6} /\| LM 39.6M \| offloading/ {o=$6} /\| LM bf16  \| offloading/ {h=$6}
      END {gsub(/ /, "", b); gsub(/ /, "", o); gsub(/ /, "", h); printf "peak MB: fp32 %s, fp32 offloading %s, bf16 offloading %s", b, o, h}' "$step_log")"
    row "bench_memory, $device" ok "$peaks" $step_seconds
  else
    row "bench_memory, $device" FAILED "$(tail_reason "$step_log")" $step_seconds
  fi
}

if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT/logs" || die "cannot create $OUT/logs"
  {
    echo "gpu_check on $device ($( [[ $device == cuda ]] && "$python" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null || echo "$(nproc) cores, dry run")), $(date -u +%Y-%m-%dT%H:%MZ), pack: $(head -1 "$pack/MANIFEST")"
    echo
    echo "| check | result | figure | seconds |"
    echo "|---|---|---|---|"
  } >"$OUT/gpu_check.md"
fi
started=$SECONDS
for name in "${selected[@]}"; do
  step_budget=$(step_budget_of "$name")
  step_start=$SECONDS
  echo "gpu_check: step $name (budget ${step_budget} s)"
  "step_$name"
  echo "gpu_check: step $name took $((SECONDS - step_start)) s"
done
summary="$(
  echo "| check | result | figure | seconds |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
)"
echo
echo "gpu_check on $device, steps ${selected[*]}: $((SECONDS - started)) s"
echo "$summary"
rm -rf "$work"
[[ "$summary" == *FAILED* ]] && exit 1
exit 0
