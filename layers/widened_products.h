// layers/widened_products.h: matrix products of bf16 operands on CPUs where ATen has no fast
// bf16 GEMM. ATen multiplies bf16 through oneDNN only where the CPU has AVX-512 (BW, VL, DQ);
// elsewhere (an AVX2-only CPU such as AMD Zen 3) it falls back to a scalar loop about 50 times
// slower than its float32 GEMM. There the operands are widened to float32 (exact: a bf16 value
// is a float32 whose low 16 bits are zero, and the product of two has at most 16 significant
// bits), multiplied by the float32 GEMM, which sums in float32 as the bf16 GEMM does, and the
// result is rounded once to bf16: the same model of rounding, another summation order. Every
// other product (float32, float64, a GPU's, a CPU with AVX-512) is torch's own call.
// Opt-in: RETORT_BF16_PRODUCTS=auto widens where the CPU lacks AVX-512, widened forces it on
// any CPU, native (the default) never widens. Not the default yet because the planner does not
// count the widened copies' transient memory (tests run both forms).
#pragma once
#include <torch/torch.h>

namespace retort::layers {

// Whether bf16 CPU products are widened to float32 here (the CPU's check, or the variable).
bool widens_bf16_products();

// torch::matmul / torch::mm (autograd records the casts: gradients flow as through torch's)...
torch::Tensor matmul_widening(const torch::Tensor& a, const torch::Tensor& b);
// ... at::mm_out into `out` (any type: the result is rounded to bf16 once, then cast into it) ...
void mm_out_widening(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b);
// ... and out += a b (out in a's type or wider; widened, a bf16 out is rounded once).
void add_mm_widening(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b);

}  // namespace retort::layers
