// layers/mlp.cpp: see mlp.h.
#include "layers/mlp.h"

#include <cmath>

#include "layers/fused_ops.h"
#include "layers/kernel_route.h"

namespace retort::layers {

SwiGluMlp::SwiGluMlp(const ModelConfig& c, const std::string& p, ParameterStore& store,
                     const TensorParallel& tp) {
  const double out_std = c.init_std / std::sqrt(2.0 * c.layers);
  gate_.emplace(LinearSpec{p + "gate_proj", c.hidden, c.ffn_hidden, c.init_std}, store, tp);
  up_.emplace(LinearSpec{p + "up_proj", c.hidden, c.ffn_hidden, c.init_std}, store, tp);
  down_.emplace(LinearSpec{p + "down_proj", c.ffn_hidden, c.hidden, out_std}, store, tp);
  place_adjacent({&*gate_, &*up_});  // the fused gate|up product reads them in place
}

torch::Tensor SwiGluMlp::forward(const torch::Tensor& x, const RecomputePolicy& recompute,
                                 const KernelPolicy& kernels) const {
  // Fused: one product by [W_gate; W_up] and the SwiGLU on its packed output. Selective
  // checkpointing keeps the product's output (gate and up) and recomputes the SwiGLU.
  std::vector<torch::Tensor> kept;
  RecomputeFn product;
  if (fused_block_parts(kernels, x)) {
    kept = {packed_column_forward({&*gate_, &*up_}, x)};
    product = [](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{fused_swiglu_packed(in[0])};
    };
  } else {
    kept = {gate_->forward(x), up_->forward(x)};
    product = [](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{torch::silu(in[0]) * in[1]};
    };
  }
  if (!recompute.active(Checkpointing::selective)) return down_->forward(product(kept)[0]);
  return down_->forward(run_recomputed(product, kept, recompute.offloader)[0]);
}

}  // namespace retort::layers
