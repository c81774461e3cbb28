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
  // One product by [W_gate; W_up]; the SwiGLU on its packed output, by our loop when fused.
  // Selective checkpointing keeps the product's output (gate and up) and recomputes the SwiGLU.
  const std::vector<torch::Tensor> kept{packed_column_forward({&*gate_, &*up_}, x, kernels.run)};
  RecomputeFn product;
  if (fused_block_parts(kernels, x)) {
    product = [](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{fused_swiglu_packed(in[0])};
    };
  } else {
    product = [](const std::vector<torch::Tensor>& in) {
      const int64_t width = in[0].size(-1) / 2;
      return std::vector<torch::Tensor>{torch::silu(in[0].narrow(-1, 0, width)) *
                                        in[0].narrow(-1, width, width)};
    };
  }
  if (!recompute.active(Checkpointing::selective))
    return down_->forward(product(kept)[0], kernels.run);
  return down_->forward(run_recomputed(product, kept, recompute.offloader)[0], kernels.run);
}

}  // namespace retort::layers
