// engine/hf/hf_model.h: Hugging Face Llama-family model directories (Llama, Mistral, Qwen2,
// Qwen3, Phi-3): config.json to and from our ModelConfig, the parameter names of both sides, and
// the weights: model.safetensors, or model-*.safetensors shards listed by
// model.safetensors.index.json, read tensor by tensor from the mapped files and converted
// (bf16, fp16, fp32, fp64) to the store's dtype, each rank taking only its own TP shard.
// Rotary layout: Hugging Face's Llama applies RoPE rotate-half (the first and second halves
// of each head pair up), which is our layout too (layers/functional.h), so q_proj and k_proj
// load as they are; an interleaved implementation (Meta's original checkpoints) would need the
// rows of each head permuted, and is not read here.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/hf/safetensors.h"
#include "layers/model_config.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"

namespace retort::hf {

// A directory holding config.json (the test for "is this a Hugging Face model").
bool is_hf_model_dir(const std::string& path);

// config.json -> ModelConfig. Refuses what the model cannot represent, naming the key: a
// model_type other than llama, mistral, qwen2, qwen3 and phi3, another hidden_act, a rope_type
// other than default, linear, llama3 and yarn, RoPE on part of each head, attention_bias on a
// Llama or Qwen3 (it biases o_proj too), a mlp_bias. A head_dim of its own becomes
// model.head_dim; rope_scaling (or transformers 5's rope_parameters) becomes
// model.rope_scaling and its parameters.
layers::ModelConfig read_hf_config(const std::string& dir);
// config.json's max_position_embeddings (the context it was trained for), 0 without one.
int64_t read_hf_max_positions(const std::string& dir);
// config.json's model_type (phi3 stores its weights fused: hf_phi3.h).
std::string read_hf_model_type(const std::string& dir);
// ModelConfig -> config.json text (model_type qwen3 with q/k norms, qwen2 with qkv bias,
// mistral with a window, else llama; or the model_type asked for: phi3), naming the weights'
// type as transformers does ("float32", "bfloat16", "float16").
std::string hf_config_json(const layers::ModelConfig& config,
                           const std::string& weights_dtype = "float32",
                           const std::string& model_type = "");

// Our parameter name -> the Hugging Face name ("layers.3.attn.q_proj.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); nullopt for names Hugging Face has no tensor for.
std::optional<std::string> hf_name(const std::string& ours);

// The tensors of a model directory, across its shard files.
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  // Hugging Face name -> its file's entry (null when absent).
  const StTensor* find(const std::string& name) const;
  std::vector<std::string> names() const;
  // The whole tensor in `dtype` (one copy; the file stays mapped).
  torch::Tensor read(const std::string& name, torch::ScalarType dtype) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> index in files_
};

// Fills every parameter of `store` (this rank's shards, any TP layout, one pipeline stage or
// all) from a Hugging Face directory whose config matches `config`. Strict: a parameter with
// no tensor, or a tensor of the wrong shape, is an error naming file and tensor; so is a
// tensor of the directory a model of `config` has no place for (checked against the whole
// model's names, so every stage decides alike without communicating).
void load_hf_parameters(const std::string& dir, const layers::ModelConfig& config,
                        layers::ParameterStore& store, const layers::TensorParallel& tp);

}  // namespace retort::hf
