// kernels/dispatch.cpp: see dispatch.h.
#include "kernels/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/attention_kernels.h"
#include "kernels/tile_gemm.h"

namespace retort::kernels {
namespace {

KernelMode mode_from_environment() {
  const char* value = std::getenv("RETORT_KERNELS");
  // The config key runtime.kernels spells it "automatic"; both spellings are taken here.
  if (!value || !*value || std::strcmp(value, "auto") == 0 || std::strcmp(value, "automatic") == 0)
    return KernelMode::automatic;
  if (std::strcmp(value, "aten") == 0) return KernelMode::aten;
  std::fprintf(stderr, "error: RETORT_KERNELS='%s' is not one of automatic (or auto), aten\n",
               value);
  std::exit(2);
}

bool float_or_double(ElementType dtype) {
  return dtype == ElementType::f32 || dtype == ElementType::f64;
}

}  // namespace

KernelMode kernel_mode_for(KernelMode configured) {
  return configured == KernelMode::aten ? KernelMode::aten : mode_from_environment();
}

Route route(Operation op, const Work& work, KernelMode mode) {
  if (mode == KernelMode::aten || work.device != DeviceKind::cpu) return Route::aten;
  bool ours = false;
  switch (op) {
    case Operation::linear_product:
      ours = work.dtype == ElementType::f32 && tile_gemm_available() &&
             work.rows >= kTileProducts.min_rows && work.rows <= kTileProducts.max_rows &&
             work.inner <= kTileProducts.max_inner;
      break;
    case Operation::attention:
      ours = float_or_double(work.dtype) && attention_blas_available();
      break;
    case Operation::block_row_loops:  // bf16 rows too (kernels/bfloat16.h)
    case Operation::head_cross_entropy:
      ours = float_or_double(work.dtype) || work.dtype == ElementType::bf16;
      break;
    case Operation::logit_loss:
      ours = float_or_double(work.dtype);
      break;
  }
  return ours ? Route::ours : Route::aten;
}

}  // namespace retort::kernels
