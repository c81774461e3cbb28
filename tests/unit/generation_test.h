// tests/unit/generation_test.h: the model the generation tests share, in float64 (or the
// type and device given): a
// 300-token vocabulary (padded under TP), GQA, qkv bias, a sliding-window layer between two
// full ones (window 5, shorter than the sequences), weights large enough that the next
// token distribution is far from uniform.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "layers/model.h"
#include "layers/parameters.h"

namespace retort::test {

struct GenerationModel {
  layers::ModelConfig config;
  std::unique_ptr<layers::ParameterStore> store;
  std::unique_ptr<layers::LlamaModel> model;
};

inline GenerationModel generation_model(const layers::TensorParallel& tp = {},
                                        torch::ScalarType dtype = torch::kDouble,
                                        torch::Device device = torch::kCPU) {
  GenerationModel m;
  m.config.vocab_size = 300;
  m.config.hidden = 64;
  m.config.layers = 3;
  m.config.heads = 4;
  m.config.kv_heads = 2;
  m.config.ffn_hidden = 96;
  m.config.layer_windows = {0, 5, 0};
  m.config.qkv_bias = true;
  m.config.init_std = 0.2;
  m.store = std::make_unique<layers::ParameterStore>(77, dtype, tp.position(), device);
  m.model = std::make_unique<layers::LlamaModel>(m.config, *m.store, tp);
  return m;
}

}  // namespace retort::test
