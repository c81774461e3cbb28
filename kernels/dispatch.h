// kernels/dispatch.h: the one place that decides which implementation runs an operation:
// Retort's own loops (this folder) or ATen's operators, from the device, the element type and
// the shape; later the bf16 and CUDA variants. layers/, distill/ and engine/ ask route() one
// question per call and never test CPU features themselves. It also holds the size thresholds,
// as one table. Torch-free: callers describe their tensors (layers/kernel_route.h does it for
// torch tensors).
#pragma once
#include <cstdint>

namespace retort::kernels {

enum class Operation {
  linear_product,      // y = x W^T and dx = dy W of the linear layers (kernels/tile_gemm.h)
  attention,           // the blocked causal attention's tiles (kernels/attention_kernels.h)
  block_row_loops,     // RMSNorm, SwiGLU, RoPE (kernels/row_loops.h)
  head_cross_entropy,  // the fused LM head's softmax cross-entropy (kernels/row_loops.h)
  logit_loss,          // the dense logit-distillation losses (kernels/logit_kernels.h)
};

enum class Route { ours, aten };
enum class DeviceKind { cpu, cuda, other };
enum class ElementType { f32, f64, bf16, f16, other };

// What the operation runs on. rows and inner: a product's rows of A and inner dimension
// (linear_product only).
struct Work {
  DeviceKind device = DeviceKind::cpu;
  ElementType dtype = ElementType::f32;
  int64_t rows = 0, inner = 0;
};

// automatic: route() follows the table below. aten: every operation to ATen, for measuring and
// for testing the ATen paths (runtime.kernels: aten, or RETORT_KERNELS=aten in the environment,
// which forces it whatever the key). The mode is a run's, never the process's: each trainer
// carries its own (layers/kernel_policy.h) and hands it to route() with every question, so two
// trainers in one process may run with different ones.
enum class KernelMode { automatic, aten };
// The mode a run with runtime.kernels = `configured` gets: aten if either it or the environment
// asks for it. kernel_mode_for(automatic) is the environment's alone (what code outside a run
// uses).
KernelMode kernel_mode_for(KernelMode configured);

Route route(Operation op, const Work& work, KernelMode mode);

// The size thresholds, one table. The tile products win against the wheel's MKL (fp32,
// AVX-512) on 64-256 rows with an inner dimension of at most 1536, and lose at 1024 rows and
// on the LM head's long inner dimension. Regenerate with `build/bench/bench_products 2 3 1024
// 256`, `... 2 3 256 256` and `... 1 3 256 192` (docs/benchmarks.md, "Products").
struct TileProductRange {
  int64_t min_rows, max_rows, max_inner;
};
inline constexpr TileProductRange kTileProducts{64, 256, 1536};

}  // namespace retort::kernels
