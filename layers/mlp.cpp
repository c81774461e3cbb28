// layers/mlp.cpp: see mlp.h.
#include "layers/mlp.h"

#include <cmath>

#include "layers/fused_ops.h"

namespace retort::layers {

SwiGluMlp::SwiGluMlp(const ModelConfig& c, const std::string& p, ParameterStore& store,
                     const TensorParallel& tp) {
  const double out_std = c.init_std / std::sqrt(2.0 * c.layers);
  gate_.emplace(LinearSpec{p + "gate_proj", c.hidden, c.ffn_hidden, c.init_std}, store, tp);
  up_.emplace(LinearSpec{p + "up_proj", c.hidden, c.ffn_hidden, c.init_std}, store, tp);
  down_.emplace(LinearSpec{p + "down_proj", c.ffn_hidden, c.hidden, out_std}, store, tp);
}

torch::Tensor SwiGluMlp::forward(const torch::Tensor& x, const RecomputePolicy& recompute,
                                 const KernelPolicy& kernels) const {
  torch::Tensor gate = gate_->forward(x), up = up_->forward(x);
  const bool fused = kernels.fused;
  auto product = [fused](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{fused ? fused_swiglu(in[0], in[1])
                                            : torch::silu(in[0]) * in[1]};
  };
  // Selective checkpointing keeps gate and up; the silu and the product are recomputed.
  if (!recompute.active(Checkpointing::selective)) return down_->forward(product({gate, up})[0]);
  return down_->forward(run_recomputed(product, {gate, up}, recompute.offloader)[0]);
}

}  // namespace retort::layers
