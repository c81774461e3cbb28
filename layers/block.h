// layers/block.h: one Llama decoder block: RMSNorm, grouped-query attention with RoPE
// (causal, optional sliding window, optional qkv bias), residual, RMSNorm, SwiGLU MLP,
// residual. A block is a pure function of (input, its parameters, the per-step context), so
// it can be recomputed in backward for activation checkpointing.
//
// Tensor parallel: q/k/v and gate/up are column-parallel (heads and ffn split over TP),
// o_proj and down_proj row-parallel. When kv_heads < TP each rank keeps the full k/v weights
// but uses only the rows of the one kv head its query heads read (their gradients are then
// summed over TP). Under sequence parallel the block's input and output are split along the
// sequence. Capture points sit after the TP reduction.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "layers/attention.h"
#include "layers/capture.h"
#include "layers/kernel_policy.h"
#include "layers/kv_cache.h"
#include "layers/mlp.h"
#include "layers/model_config.h"
#include "layers/parameters.h"
#include "layers/recompute.h"
#include "layers/tensor_parallel.h"

namespace retort::layers {

// Tables shared by every block of one forward pass.
struct BlockContext {
  torch::Tensor rope_cos, rope_sin;                 // [seq, head_dim]
  torch::Tensor mask_full;                          // causal mask [seq, seq]
  std::map<int64_t, torch::Tensor> mask_by_window;  // sliding-window masks, by window size
  RecomputePolicy recompute;                        // activation checkpointing / offloading
  KernelPolicy kernels;                             // fused or composed, blocked or dense
  // Mixed precision: the norms' outputs are cast to this type, so the blocks' products run in
  // it, while the residual stream keeps its own (float32 under model.fp32_residual).
  std::optional<torch::ScalarType> compute_type;
  const torch::Tensor& mask_for(int64_t window) const;  // undefined under blocked attention
};

// The dense masks are built only for dense attention (kernels.attention_block_rows 0).
BlockContext make_block_context(const ModelConfig& config, int64_t seq_len,
                                torch::TensorOptions options, const KernelPolicy& kernels = {});

class Block {
 public:
  Block(const ModelConfig& config, int64_t index, ParameterStore& store, TensorParallel tp = {});
  // x: [batch, seq, hidden] (seq / tp under sequence parallel) -> the same shape. Under full
  // checkpointing the captures the sink wants are outputs of the recomputed block, so the
  // losses on them backpropagate into it.
  torch::Tensor forward(const torch::Tensor& x, const BlockContext& context,
                        CaptureSink* sink) const;
  // Incremental decoding: x [b, n, h] at positions position..position+n-1, with the RoPE
  // rows of those positions and each window's mask [n, position+n] in `context`; this
  // block's keys and values are appended to `cache` (see KvCache).
  torch::Tensor forward_cached(const torch::Tensor& x, const BlockContext& context, KvCache& cache,
                               int64_t position) const;
  int64_t index() const { return index_; }

 private:
  torch::Tensor forward_parts(const torch::Tensor& x, const BlockContext& context,
                              CaptureSink* sink) const;

  double norm_eps_;
  TensorParallel tp_;
  int64_t index_;
  torch::Tensor attn_norm_, mlp_norm_;
  Attention attention_;
  SwiGluMlp mlp_;
};

}  // namespace retort::layers
