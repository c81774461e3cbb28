// layers/model_config.h: the shape of a Llama-family decoder (sizes, RoPE, windows, ties)
// and the counts derived from it: parameters and training FLOPs per token. Plain C++.
#pragma once
#include <cstdint>
#include <vector>

namespace retort::layers {

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t hidden = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t ffn_hidden = 172;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  int64_t sliding_window = 0;          // 0 = full causal attention in every layer
  std::vector<int64_t> layer_windows;  // per-layer override; empty = sliding_window everywhere
  bool qkv_bias = false;
  bool tied_embeddings = false;

  int64_t head_dim() const { return hidden / heads; }
  int64_t window_of_layer(int64_t layer) const {
    return layer_windows.empty() ? sliding_window : layer_windows[layer];
  }
  int64_t parameter_count() const;
  // Non-embedding parameters: the N of the 6N FLOPs-per-token rule.
  int64_t matmul_parameter_count() const;
  // Training FLOPs per token (forward + backward = 3 x forward) at sequence length seq,
  // counting every matrix product including the LM head and the attention score/value
  // products (restricted to the causal or sliding window).
  double training_flops_per_token(int64_t seq_len) const;
};

}  // namespace retort::layers
