// layers/model_config.cpp: see model_config.h.
#include "layers/model_config.h"

#include <algorithm>

namespace retort::layers {

int64_t ModelConfig::matmul_parameter_count() const {
  const int64_t d = head_dim();
  const int64_t attn = hidden * heads * d * 2 + hidden * kv_heads * d * 2;
  const int64_t mlp = 3 * hidden * ffn_hidden;
  return layers * (attn + mlp) + vocab_size * hidden;  // the LM head is a matrix product
}

int64_t ModelConfig::parameter_count() const {
  const int64_t d = head_dim();
  const int64_t bias = qkv_bias ? (heads + 2 * kv_heads) * d : 0;
  const int64_t qk_norms = qk_norm ? 2 * d : 0;
  const int64_t per_layer = 2 * hidden + bias + qk_norms;  // two norms, optional qkv bias, qk norms
  const int64_t embeddings = tied_embeddings ? 0 : vocab_size * hidden;
  return matmul_parameter_count() + layers * per_layer + hidden + embeddings;
}

double ModelConfig::training_flops_per_token(int64_t seq_len) const {
  double attention = 0;  // 2 products (QK^T, PV) x 2 flops x heads x head_dim x keys seen
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t window = window_of_layer(layer);
    double keys = 0;  // mean number of keys a query attends to
    for (int64_t i = 0; i < seq_len; ++i) keys += window > 0 ? std::min(i + 1, window) : i + 1;
    keys /= static_cast<double>(seq_len);
    attention += 4.0 * heads * head_dim() * keys;
  }
  const double forward = 2.0 * static_cast<double>(matmul_parameter_count()) + attention;
  return 3.0 * forward;
}

int64_t padded_vocab_size(int64_t vocab_size, int tp_size) {
  const int64_t multiple = 128 * int64_t(tp_size);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int64_t padded_vocab_size(const ModelConfig& config, int tp_size) {
  return padded_vocab_size(std::max(config.vocab_size, config.vocab_padding_covers), tp_size);
}

void pad_vocabularies_alike(ModelConfig& student, ModelConfig& teacher) {
  const int64_t larger = std::max(student.vocab_size, teacher.vocab_size);
  student.vocab_padding_covers = teacher.vocab_padding_covers = larger;
}

}  // namespace retort::layers
