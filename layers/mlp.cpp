// layers/mlp.cpp: see mlp.h.
#include "layers/mlp.h"

#include <cmath>

namespace retort::layers {

SwiGluMlp::SwiGluMlp(const ModelConfig& c, const std::string& p, ParameterStore& store,
                     const TensorParallel& tp) {
  const double out_std = c.init_std / std::sqrt(2.0 * c.layers);
  gate_.emplace(LinearSpec{p + "gate_proj", c.hidden, c.ffn_hidden, c.init_std}, store, tp);
  up_.emplace(LinearSpec{p + "up_proj", c.hidden, c.ffn_hidden, c.init_std}, store, tp);
  down_.emplace(LinearSpec{p + "down_proj", c.ffn_hidden, c.hidden, out_std}, store, tp);
}

torch::Tensor SwiGluMlp::forward(const torch::Tensor& x, const RecomputePolicy& recompute) const {
  torch::Tensor gate = gate_->forward(x), up = up_->forward(x);
  if (!recompute.active(Checkpointing::selective)) return down_->forward(torch::silu(gate) * up);
  // Keep gate and up; the silu and the product are recomputed in backward.
  auto product = [](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{torch::silu(in[0]) * in[1]};
  };
  return down_->forward(run_recomputed(product, {gate, up}, recompute.offloader)[0]);
}

}  // namespace retort::layers
