// layers/widened_products.cpp: see widened_products.h.
#include "layers/widened_products.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace retort::layers {
namespace {

// ATen's own test for its oneDNN bf16 products on x86 (mkldnn_bf16_device_check).
bool cpu_has_fast_bf16_products() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return true;  // another architecture: torch's own choice
#endif
}

bool decide() {
  const char* value = std::getenv("RETORT_BF16_PRODUCTS");
  // Opt-in for now (unset: native): the widened copies and float32 results are transient
  // memory the planner (engine/plan) does not count yet.
  if (!value || !*value || std::strcmp(value, "native") == 0) return false;
  if (std::strcmp(value, "auto") == 0) return !cpu_has_fast_bf16_products();
  if (std::strcmp(value, "widened") == 0) return true;
  std::fprintf(stderr, "error: RETORT_BF16_PRODUCTS='%s' is not one of auto, widened, native\n",
               value);
  std::exit(2);
}

bool widen(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == torch::kBFloat16 && b.scalar_type() == torch::kBFloat16 &&
         a.device().is_cpu() && widens_bf16_products();
}

}  // namespace

bool widens_bf16_products() {
  static const bool widened = decide();
  return widened;
}

torch::Tensor matmul_widening(const torch::Tensor& a, const torch::Tensor& b) {
  if (!widen(a, b)) return torch::matmul(a, b);
  return torch::matmul(a.to(torch::kFloat), b.to(torch::kFloat)).to(torch::kBFloat16);
}

void mm_out_widening(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  if (!widen(a, b)) {
    if (out.scalar_type() == a.scalar_type())
      at::mm_out(out, a, b);
    else
      out.copy_(torch::mm(a, b));
    return;
  }
  // Rounded to bf16 as the bf16 product's output is, whatever out's type: a weight gradient
  // formed into float32 memory offered for it then equals the one autograd forms in bf16 and
  // widens (the DP sum's shared memory against one rank's accumulation, bit for bit).
  out.copy_(torch::mm(a.to(torch::kFloat), b.to(torch::kFloat)).to(torch::kBFloat16));
}

void add_mm_widening(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  if (!widen(a, b)) {
    if (out.scalar_type() == a.scalar_type())
      out.addmm_(a, b);
    else
      out.add_(torch::mm(a, b));
    return;
  }
  torch::Tensor product = torch::mm(a.to(torch::kFloat), b.to(torch::kFloat));
  if (out.scalar_type() == torch::kBFloat16)  // one rounding of the sum, as addmm_ makes it
    out.copy_(product.add_(out.to(torch::kFloat)));
  else
    out.add_(product);
}

}  // namespace retort::layers
