// layers/model_config.h: the shape of a Llama-family decoder (sizes, RoPE, windows, ties)
// and the counts derived from it: parameters and training FLOPs per token. Plain C++.
#pragma once
#include <cstdint>
#include <vector>

#include "common/config_fields.h"
#include "common/named_enum.h"

namespace retort::layers {

RETORT_NAMED_ENUM(RopeScaling, none, linear, llama3, yarn)

// The model.* keys (engine/config/key_table.h): type, member, path, default, range, help.
#define RETORT_MODEL_KEYS(KEY)                                                                  \
  KEY(int64_t, vocab_size, "model.vocab_size", 256, 1, 1e9, "vocabulary size")                  \
  KEY(int64_t, hidden, "model.hidden", 64, 1, 1e6, "hidden size")                               \
  KEY(int64_t, layers, "model.layers", 2, 1, 10000, "number of decoder blocks")                 \
  KEY(int64_t, heads, "model.heads", 4, 1, 10000, "attention heads")                            \
  KEY(int64_t, kv_heads, "model.kv_heads", 2, 1, 10000, "key/value heads (GQA); divides heads") \
  KEY(int64_t, explicit_head_dim, "model.head_dim", 0, 0, 1e5,                                  \
      "size of each attention head; 0 = model.hidden / model.heads")                            \
  KEY(int64_t, ffn_hidden, "model.ffn_hidden", 172, 1, 1e7, "SwiGLU inner size")                \
  KEY(double, rope_theta, "model.rope_theta", 10000.0, 1, kUnbounded, "RoPE base")              \
  KEY(RopeScaling, rope_scaling, "model.rope_scaling", RopeScaling::none, 0, 0,                 \
      "RoPE's frequencies stretched for a longer context, as transformers' rope_type: none, "   \
      "linear, llama3 (Llama 3.1-3.3), yarn (Qwen)")                                            \
  KEY(double, rope_factor, "model.rope_factor", 1.0, 1, 1e6,                                    \
      "rope_scaling: how many times the original context the model reaches")                    \
  KEY(double, rope_low_freq_factor, "model.rope_low_freq_factor", 1.0, 0, 1e6,                  \
      "rope_scaling=llama3: wavelengths above original_context / this are divided by factor")   \
  KEY(double, rope_high_freq_factor, "model.rope_high_freq_factor", 4.0, 0, 1e6,                \
      "rope_scaling=llama3: wavelengths below original_context / this are kept")                \
  KEY(int64_t, rope_original_context, "model.rope_original_context", 0, 0, 1e9,                 \
      "rope_scaling=llama3 or yarn: the context the model was pretrained for")                  \
  KEY(double, rope_attention_factor, "model.rope_attention_factor", 0.0, 0, 1e3,                \
      "rope_scaling=yarn: scale of the cos and sin tables; 0 = 0.1 ln(factor) + 1")             \
  KEY(double, rope_beta_fast, "model.rope_beta_fast", 32.0, 0, 1e6,                             \
      "rope_scaling=yarn: rotations above which a pair is kept (extrapolated)")                 \
  KEY(double, rope_beta_slow, "model.rope_beta_slow", 1.0, 0, 1e6,                              \
      "rope_scaling=yarn: rotations below which a pair is divided by factor (interpolated)")    \
  KEY(double, norm_eps, "model.norm_eps", 1e-5, 0, 1, "RMSNorm epsilon")                        \
  KEY(double, init_std, "model.init_std", 0.02, 0, 10, "std of normal initialisation")          \
  KEY(int64_t, sliding_window, "model.sliding_window", 0, 0, 1e9,                               \
      "attention window, 0 = full causal")                                                      \
  KEY(std::vector<int64_t>, layer_windows, "model.layer_windows", {}, 0, 1e9,                   \
      "per-layer windows (0 = full); empty = model.sliding_window everywhere")                  \
  KEY(bool, qkv_bias, "model.qkv_bias", false, 0, 0, "bias on q, k, v projections")             \
  KEY(bool, qk_norm, "model.qk_norm", false, 0, 0,                                              \
      "RMSNorm on each head's query and key before RoPE, one weight of head_dim (Qwen3)")       \
  KEY(bool, tied_embeddings, "model.tied_embeddings", false, 0, 0, "LM head shares embedding")

struct ModelConfig {
  RETORT_MODEL_KEYS(RETORT_FIELD)
  // Not a key and not stored: the vocabulary the padding rounds up when it is larger than
  // vocab_size (0: vocab_size). A distillation run pads its student and teacher alike
  // (pad_vocabularies_alike), so every TP rank holds the same ids of both.
  int64_t vocab_padding_covers = 0;

  // model.head_dim where set (Qwen3, Mistral-Nemo), else hidden / heads.
  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden / heads; }
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

// Vocabulary rows after padding to a multiple of TP x 128 (as Megatron pads).
int64_t padded_vocab_size(int64_t vocab_size, int tp_size);
// A model's embedding and head rows: its vocabulary, or vocab_padding_covers, padded so.
int64_t padded_vocab_size(const ModelConfig& config, int tp_size);
// A student and a teacher whose vocabularies differ (one padded further than the other, same
// tokenizer): both padded to cover the larger, so their vocabulary-parallel slices line up.
void pad_vocabularies_alike(ModelConfig& student, ModelConfig& teacher);

}  // namespace retort::layers
