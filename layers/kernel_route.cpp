// layers/kernel_route.cpp: see kernel_route.h.
#include "layers/kernel_route.h"

namespace retort::layers {

kernels::Work work_of(const torch::Tensor& t, int64_t rows, int64_t inner) {
  kernels::Work work;
  work.device = t.device().is_cpu()    ? kernels::DeviceKind::cpu
                : t.device().is_cuda() ? kernels::DeviceKind::cuda
                                       : kernels::DeviceKind::other;
  switch (t.scalar_type()) {
    case torch::kFloat:
      work.dtype = kernels::ElementType::f32;
      break;
    case torch::kDouble:
      work.dtype = kernels::ElementType::f64;
      break;
    case torch::kBFloat16:
      work.dtype = kernels::ElementType::bf16;
      break;
    case torch::kHalf:
      work.dtype = kernels::ElementType::f16;
      break;
    default:
      work.dtype = kernels::ElementType::other;
  }
  work.rows = rows;
  work.inner = inner;
  return work;
}

}  // namespace retort::layers
