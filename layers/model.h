// layers/model.h: the Llama-family decoder: token embedding, blocks, final RMSNorm and LM
// head (tied to the embedding or not), plus the summed cross-entropy the trainer normalises
// by the global number of target tokens. Under tensor parallelism the vocabulary (padded to
// a multiple of TP x 128) is split over ranks and logits stay split; under sequence
// parallelism the residual stream is split along the sequence between embedding and head.
//
// Under pipeline parallelism a model object holds one stage: a contiguous range of blocks,
// the embedding on the first stage and final norm and head on the last. With tied
// embeddings the last stage keeps its own copy of embed.weight (spec tied_copy), kept equal
// to the first stage's by summing their gradients.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <vector>

#include "layers/block.h"
#include "layers/capture.h"
#include "layers/head_grad_sink.h"
#include "layers/kv_cache.h"
#include "layers/model_config.h"
#include "layers/parameters.h"
#include "layers/run_context.h"
#include "layers/tensor_parallel.h"

namespace retort::layers {

inline constexpr int64_t kIgnoreIndex = -100;

// The part of the model one pipeline stage holds. The default is the whole model.
struct ModelStage {
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // -1 = through the last layer
  bool embedding = true;   // the first stage
  bool head = true;        // the last stage: final norm, LM head, loss
};

class LlamaModel {
 public:
  LlamaModel(const ModelConfig& config, ParameterStore& store, TensorParallel tp = {},
             ModelStage stage = {});

  // Whole model only. tokens [batch, seq] (int64, the full sequence on every TP rank) ->
  // this rank's logits [batch, seq, padded_vocab / tp]; padded vocabulary entries are -inf.
  torch::Tensor forward(const torch::Tensor& tokens, CaptureSink* sink = nullptr) const;
  // Whole model only. Sum over target tokens (targets != kIgnoreIndex) of the cross-entropy;
  // the same value on every TP rank.
  torch::Tensor loss_sum(const torch::Tensor& tokens, const torch::Tensor& targets,
                         CaptureSink* sink = nullptr) const;

  // Whole model, no sequence parallelism, no autograd: the logits [b, n, padded_vocab / tp]
  // (padding -inf) of `tokens` [b, n], which continue the cache's positions; their keys and
  // values are added to `cache` (capacity positions, allocated on first use). Equal to
  // forward() of the whole sequence at those positions.
  torch::Tensor forward_cached(const torch::Tensor& tokens, KvCache& cache) const;

  // The pieces a pipeline stage runs. The hidden state is [b, s, h] ([b, s/tp, h] under STP).
  torch::Tensor embed(const torch::Tensor& tokens) const;  // first stage
  torch::Tensor run_blocks(torch::Tensor hidden, int64_t seq_len, CaptureSink* sink) const;
  torch::Tensor head_logits(const torch::Tensor& hidden) const;  // masked, last stage
  // The LM head as two pieces, logits = head_input(hidden) @ head_weight()^T (unmasked), for
  // losses that fuse the head in: the final norm then enter_column, and this rank's
  // [padded_vocab / tp, h] weight.
  torch::Tensor head_input(const torch::Tensor& hidden) const;
  const torch::Tensor& head_weight() const { return lm_head_; }
  // With the head tied to the embedding on this stage: the sink that holds the head's
  // gradient for the lookup's to add into (layers::TiedHeadGradientSink); null otherwise.
  TiedHeadGradientSink* tied_head_sink() const { return tied_head_sink_.get(); }
  // weight_grad_sink (fused head only): the head weight's gradient goes there, not to autograd.
  torch::Tensor head_loss_sum(const torch::Tensor& hidden, const torch::Tensor& targets,
                              HeadGradSink* weight_grad_sink = nullptr) const;

  const ModelConfig& config() const { return config_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  const ModelStage& stage() const { return stage_; }
  // What the blocks keep for backward (activation checkpointing and offloading).
  void set_recompute(const RecomputePolicy& policy) { recompute_ = policy; }
  const RecomputePolicy& recompute() const { return recompute_; }
  // The block's kernels and the run the layers belong to (layers/run_context.h): a model built
  // alone owns its run; a policy naming a run (a trainer's) shares that one.
  void set_kernels(const KernelPolicy& kernels);
  // Mixed precision. compute: the type the products run in (bfloat16, with the parameters
  // float32 main weights: layers/compute_copy.h). residual: the residual stream's (embedding
  // output, block inputs and outputs, what pipeline stages send): the compute type, or float32
  // (Megatron-LM's fp32_residual_connection; what torch.autocast does), and then the norms'
  // outputs are cast to the compute type and each block's output is added to the stream in
  // float32. Unset: both the parameters' type.
  void set_types(torch::ScalarType compute, torch::ScalarType residual) {
    compute_type_ = compute;
    residual_type_ = residual;
  }
  std::optional<torch::ScalarType> residual_type() const { return residual_type_; }
  const KernelPolicy& kernels() const { return kernels_; }
  // Tokens per chunk of the fused LM head + cross-entropy of head_loss_sum; 0 = unfused
  // (full logits, then the vocabulary-parallel cross-entropy).
  void set_head_chunk_tokens(int64_t tokens) { head_chunk_tokens_ = tokens; }
  int64_t head_chunk_tokens() const { return head_chunk_tokens_; }
  // memory.defer_head_gradient: the fused head tied on this stage leaves its weight's gradient
  // to be formed at the lookup's backward (TiedHeadGradientSink). Returns whether it applies
  // here (a head tied to the embedding on this stage); elsewhere nothing changes.
  bool set_defer_head_gradient(bool defer) {
    if (tied_head_sink_) tied_head_sink_->set_defers(defer);
    return tied_head_sink_ != nullptr;
  }

 private:
  torch::Tensor unmasked_logits(const torch::Tensor& hidden) const;

  ModelConfig config_;
  TensorParallel tp_;
  ModelStage stage_;
  RecomputePolicy recompute_;
  std::unique_ptr<RunContext> own_run_;  // the run until set_kernels names another
  KernelPolicy kernels_;
  int64_t head_chunk_tokens_ = 256;
  std::optional<torch::ScalarType> compute_type_, residual_type_;
  torch::Tensor embed_, final_norm_, lm_head_;
  std::unique_ptr<TiedHeadGradientSink> tied_head_sink_;
  std::vector<Block> blocks_;
};

// Number of targets that count in the loss.
int64_t count_targets(const torch::Tensor& targets);

}  // namespace retort::layers
