// layers/mlp.h: the SwiGLU MLP, down(silu(gate(x)) * up(x)), split column (gate, up) then
// row (down) over TP, so the only communication is the row layer's reduction.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "layers/kernel_policy.h"
#include "layers/model_config.h"
#include "layers/parallel_linear.h"
#include "layers/recompute.h"

namespace retort::layers {

class SwiGluMlp {
 public:
  SwiGluMlp(const ModelConfig& config, const std::string& prefix, ParameterStore& store,
            const TensorParallel& tp);
  // x: column-parallel input [b, s, h]; returns the TP-reduced output.
  torch::Tensor forward(const torch::Tensor& x, const RecomputePolicy& recompute = {},
                        const KernelPolicy& kernels = {}) const;

 private:
  std::optional<ColumnParallelLinear> gate_, up_;
  std::optional<RowParallelLinear> down_;
};

}  // namespace retort::layers
