// tests/unit/cuda_head_test.cpp: the GPU's forms of the head's weight gradient and of the
// block's RMSNorm, on a machine with a GPU (each test skips itself without one;
// tools/gpu_check.sh runs them among its CUDA unit tests): a chunk's bf16 product reaches the
// float32 gradient unrounded (one product with a float32 result), within float32 round-off of
// float64; the RMSNorm is ATen's fused operator, within one bf16 rounding of float64.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "layers/fused_ops.h"
#include "layers/head_grad_sink.h"

using namespace retort;

namespace {

// Whether a float32 value is exactly a bf16 one (its low 16 bits zero).
bool is_bf16_value(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return (bits & 0xffffu) == 0;
}

}  // namespace

TEST(CudaHead, ChunkProductReachesTheFloat32GradientUnrounded) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  at::globalContext().setAllowTF32CuBLAS(false);
  torch::manual_seed(0);
  const int64_t tokens = 4096, vocab = 512, hidden = 256;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const torch::Tensor dz = torch::randn({tokens, vocab}, cuda).to(torch::kBFloat16);
  const torch::Tensor x = torch::randn({tokens, hidden}, cuda).to(torch::kBFloat16);
  torch::Tensor grad = torch::zeros({vocab, hidden}, cuda);
  layers::add_transposed_product(grad, dz, x);
  const torch::Tensor got = grad.cpu();
  const torch::Tensor a = dz.cpu().to(torch::kDouble), b = x.cpu().to(torch::kDouble);
  const torch::Tensor exact = a.t().mm(b);
  // Each product of two bf16 values is exact in float32; a float32 sum of `tokens` terms is
  // off by at most tokens * 2^-24 * sum |a_i b_i| (Higham's gamma_n, first order).
  const torch::Tensor bound = a.abs().t().mm(b.abs()) * (double(tokens) * std::ldexp(1.0, -24));
  EXPECT_TRUE((got.to(torch::kDouble) - exact).abs().le(bound).all().item<bool>());
  // A product rounded to bf16 before the add would leave only bf16 values in a zeroed sum.
  int64_t bf16_values = 0;
  const float* values = got.data_ptr<float>();
  for (int64_t i = 0; i < got.numel(); ++i) bf16_values += is_bf16_value(values[i]);
  EXPECT_LT(bf16_values, got.numel() / 10) << "of " << got.numel() << " elements";
}

TEST(CudaHead, BlockRmsNormIsAtensFusedOperator) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  torch::manual_seed(0);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const torch::Tensor x = torch::randn({4, 32, 256}, cuda).requires_grad_(true);
  const torch::Tensor weight = torch::rand({256}, cuda) + 0.5;
  const torch::Tensor y =
      layers::stream_rms_norm(layers::KernelPolicy{}, x, weight, torch::kBFloat16, 1e-5);
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  // Its backward node (behind the cast to bf16) is the fused operator's.
  bool fused = false;
  std::vector<std::shared_ptr<torch::autograd::Node>> nodes{y.grad_fn()};
  for (int depth = 0; depth < 3 && !fused; ++depth) {
    std::vector<std::shared_ptr<torch::autograd::Node>> next;
    for (const auto& node : nodes) {
      if (!node) continue;
      fused |= node->name().find("FusedRmsNorm") != std::string::npos;
      for (const auto& edge : node->next_edges()) next.push_back(edge.function);
    }
    nodes = next;
  }
  EXPECT_TRUE(fused) << "first node: " << y.grad_fn()->name();
  // Normalised and scaled in float32, rounded once to bf16: within 2^-8 of the float64 value.
  const torch::Tensor xd = x.detach().cpu().to(torch::kDouble);
  const torch::Tensor wd = weight.cpu().to(torch::kBFloat16).to(torch::kDouble);
  const torch::Tensor exact = xd * torch::rsqrt(xd.pow(2).mean(-1, true) + 1e-5) * wd;
  const torch::Tensor error = (y.detach().cpu().to(torch::kDouble) - exact).abs();
  EXPECT_TRUE(error.le(exact.abs() * (std::ldexp(1.0, -8) + std::ldexp(1.0, -20)) + 1e-6)
                  .all()
                  .item<bool>())
      << "worst " << error.max().item<double>();
  y.to(torch::kFloat).sum().backward();
  EXPECT_TRUE(x.grad().defined() && x.grad().isfinite().all().item<bool>());
}
