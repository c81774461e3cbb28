// engine/observe/device_peak.h: the peak MFU is measured against on a GPU. The device's dense
// datasheet rate for the run's dtype (bf16 tensor cores, or plain fp32: Retort keeps TF32 off),
// looked up by the name CUDA reports; a device not in the table is measured instead, as the
// best rate of large matrix products on it.
#pragma once
#include <string>

namespace retort::engine {

struct DevicePeak {
  double gflops = 0;
  std::string how;  // for the banner: "NVIDIA H100 80GB HBM3, datasheet dense bf16"
};

// The dense datasheet rate in GFLOP/s of the device CUDA names `device_name`, in bf16 or in fp32
// without TF32; 0 when the table does not know it.
double datasheet_dense_gflops(const std::string& device_name, bool bfloat16);

// The peak of CUDA device `index` for a run in bf16 (or fp32): the datasheet's, else measured.
DevicePeak device_compute_peak(int index, bool bfloat16);

// The name CUDA reports for device `index` ("NVIDIA H100 80GB HBM3"); "" in a build without
// CUDA.
std::string cuda_device_name(int index);

}  // namespace retort::engine
