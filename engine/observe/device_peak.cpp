// engine/observe/device_peak.cpp: see device_peak.h.
#include "engine/observe/device_peak.h"

#include <torch/torch.h>

#include "engine/observe/gemm_peak.h"

namespace retort::engine {
namespace {

// Dense (no sparsity) rates in TFLOP/s from NVIDIA's datasheets. The more specific names come
// first: "H100 NVL" and "H100 PCIe" before the SXM parts that "H100" alone names.
struct DatasheetRow {
  const char* name_part;
  double bf16_tflops, fp32_tflops;
};
constexpr DatasheetRow kDatasheet[] = {
    {"H200 NVL", 835.0, 60.0}, {"H200", 989.4, 66.9},      {"GH200", 989.4, 66.9},
    {"H100 NVL", 835.0, 60.0}, {"H100 PCIe", 756.5, 51.2}, {"H100", 989.4, 66.9},
    {"H800", 989.4, 66.9},     {"A100", 312.0, 19.5},      {"L40S", 362.1, 91.6},
};

}  // namespace

double datasheet_dense_gflops(const std::string& device_name, bool bfloat16) {
  for (const DatasheetRow& row : kDatasheet)
    if (device_name.find(row.name_part) != std::string::npos)
      return 1e3 * (bfloat16 ? row.bf16_tflops : row.fp32_tflops);
  return 0;
}

DevicePeak device_compute_peak(int index, bool bfloat16) {
  const std::string name = cuda_device_name(index);
  const char* dtype = bfloat16 ? "bf16" : "fp32";
  DevicePeak peak;
  peak.gflops = datasheet_dense_gflops(name, bfloat16);
  if (peak.gflops > 0) {
    peak.how = name + ", datasheet dense " + dtype;
    return peak;
  }
  peak.gflops = measure_gemm_gflops_on(torch::Device(torch::kCUDA, index),
                                       bfloat16 ? torch::kBFloat16 : torch::kFloat, 8192, 3);
  peak.how = (name.empty() ? std::string("CUDA device") : name) +
             " not in the datasheet table: best 8192^3 " + dtype + " product measured";
  return peak;
}

}  // namespace retort::engine
