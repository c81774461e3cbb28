// tests/unit/device_peak_test.cpp: the GPU peak MFU is taken against (device_peak.h): the
// datasheet row each device name CUDA reports finds (the more specific parts before "H100"
// alone), and on a GPU, a peak and a banner text that name the device.
#include "engine/observe/device_peak.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace retort::engine {
namespace {

TEST(DevicePeak, EachDeviceNameFindsItsOwnDatasheetRow) {
  struct Case {
    const char* name;
    double bf16_tflops, fp32_tflops;
  };
  for (const Case& c :
       {Case{"NVIDIA H100 80GB HBM3", 989.4, 66.9}, Case{"NVIDIA H100 PCIe", 756.5, 51.2},
        Case{"NVIDIA H100 NVL", 835.0, 60.0}, Case{"NVIDIA H200", 989.4, 66.9},
        Case{"NVIDIA H200 NVL", 835.0, 60.0}, Case{"NVIDIA GH200 480GB", 989.4, 66.9},
        Case{"NVIDIA A100-SXM4-80GB", 312.0, 19.5}}) {
    EXPECT_DOUBLE_EQ(datasheet_dense_gflops(c.name, true), 1e3 * c.bf16_tflops) << c.name;
    EXPECT_DOUBLE_EQ(datasheet_dense_gflops(c.name, false), 1e3 * c.fp32_tflops) << c.name;
  }
  EXPECT_EQ(datasheet_dense_gflops("NVIDIA GeForce RTX 4090", true), 0);
  EXPECT_EQ(datasheet_dense_gflops("", true), 0);
}

TEST(CudaDevicePeak, NamesTheDeviceAndItsSource) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const std::string name = cuda_device_name(0);
  ASSERT_FALSE(name.empty());
  for (bool bf16 : {true, false}) {
    const DevicePeak peak = device_compute_peak(0, bf16);
    EXPECT_GT(peak.gflops, 1000) << peak.how;
    EXPECT_NE(peak.how.find(name), std::string::npos) << peak.how;
  }
}

}  // namespace
}  // namespace retort::engine
