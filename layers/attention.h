// layers/attention.h: grouped-query self-attention with RoPE (causal, optional sliding
// window, optional qkv bias, optional per-head RMSNorm of queries and keys before RoPE as
// Qwen3 places it), heads split over TP: q/k/v column-parallel, o row-parallel. The query and
// key norms' weights [head_dim] are whole on every TP rank; each rank's gradient is its heads'
// part, summed over TP.
// With fewer kv heads than TP ranks, each rank keeps k/v whole and uses the rows of the one
// kv head its query heads read.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "layers/kernel_policy.h"
#include "layers/model_config.h"
#include "layers/parallel_linear.h"
#include "layers/recompute.h"

namespace retort::layers {

class Attention {
 public:
  Attention(const ModelConfig& config, const std::string& prefix, int64_t window,
            ParameterStore& store, const TensorParallel& tp);
  // x: the column-parallel input [b, s, h] (full sequence, replicated over TP);
  // returns the TP-reduced output (sequence-split under STP).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& rope_cos,
                        const torch::Tensor& rope_sin, const torch::Tensor& mask,
                        const RecomputePolicy& recompute = {},
                        const KernelPolicy& kernels = {}) const;
  // Incremental decoding (no autograd, no sequence parallelism): x [b, n, h] holds the new
  // tokens at positions position .. position+n-1 (rope_cos/sin for those rows, mask
  // [n, position+n]); their keys and values go into keys/values [b, kv, capacity, d] at
  // `position`, and the queries attend to everything cached up to them.
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& rope_cos,
                               const torch::Tensor& rope_sin, const torch::Tensor& mask,
                               torch::Tensor& keys, torch::Tensor& values, int64_t position,
                               int64_t capacity, RunContext* run = nullptr) const;
  int64_t window() const { return window_; }

 private:
  // model.qk_norm: q and k [b, heads, s, d] normalised per head (identity without it).
  std::pair<torch::Tensor, torch::Tensor> norm_heads(torch::Tensor q, torch::Tensor k) const;

  int64_t head_dim_, window_;
  double norm_eps_;
  torch::Tensor q_norm_, k_norm_;  // model.qk_norm: the weights, else undefined
  std::optional<ColumnParallelLinear> q_, k_, v_;
  std::optional<RowParallelLinear> o_;
};

}  // namespace retort::layers
