// engine/observe/build_info.cpp: see build_info.h.
#include "engine/observe/build_info.h"

#include <ATen/Version.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "retort_commit.h"  // generated at build time (tools/cmake/write_commit.cmake)

namespace retort::engine {
namespace {

// The BLAS libtorch calls for fp32 products, as its own build configuration names it
// (BLAS_INFO=mkl in the PyPI wheel), with MKL's version where it is MKL.
std::string blas_in_use() {
  const std::string config = at::show_config();
  const std::string key = "BLAS_INFO=";
  const size_t at = config.find(key);
  std::string name = "unknown";
  if (at != std::string::npos)
    name = config.substr(at + key.size(), config.find_first_of(", \n", at) - at - key.size());
  if (name != "mkl" || !at::hasMKL()) return name;
  // "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build ..." -> "MKL 2024.2"
  const std::string full = at::get_mkl_version(), marker = "Version ";
  const size_t from = full.find(marker);
  if (from == std::string::npos) return "MKL";
  const size_t begin = from + marker.size();
  return "MKL " + full.substr(begin, full.find_first_of("- ", begin) - begin);
}

std::string cuda_state() {
#ifdef RETORT_WITH_NCCL
  const bool compiled = true;
#else
  const bool compiled = false;
#endif
  std::string text = compiled ? "CUDA sources and NCCL backend compiled" : "CUDA not compiled";
  if (compiled) {
    const int gpus = torch::cuda::is_available() ? int(torch::cuda::device_count()) : 0;
    text += gpus > 0 ? " (" + std::to_string(gpus) + " GPU(s) visible)" : " (no GPU visible)";
  }
  return text;
}

}  // namespace

std::string version_text() {
  return std::string("retort ") + RETORT_COMMIT + "\nlibtorch " + TORCH_VERSION + "\n" +
         cuda_state() + "\nBLAS " + blas_in_use() + "\n";
}

std::string build_summary() {
  return std::string("retort ") + RETORT_COMMIT + ", libtorch " + TORCH_VERSION + ", " +
         cuda_state() + ", BLAS " + blas_in_use();
}

}  // namespace retort::engine
