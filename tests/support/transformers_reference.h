// tests/support/transformers_reference.h: transformers' own models as references, made by
// tests/hf/make_hf_transformers.py (RETORT_PYTHON, RETORT_HF_TRANSFORMERS_SCRIPT: the test
// target defines both). make_transformers_reference writes one variant's model, as
// save_pretrained writes it, with reference.safetensors and step_gradients/ beside it;
// reference_tensor reads one of reference.safetensors' tensors; greedy_continuations gives
// transformers' greedy continuation of the reference's prompt beside a model's own.
#pragma once
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/generate/generator.h"
#include "engine/hf/safetensors.h"
#include "layers/model.h"

namespace retort::testing {

// The variants the script builds: each family's structure, scaled down.
inline const char* const kTransformersVariants[] = {
    "llama_gqa_tied",   "llama_gqa_untied", "mistral_window", "qwen2_bias",
    "qwen25_bias_tied", "mistral_head_dim", "llama3_rope",    "llama_linear_rope",
    "qwen2_yarn",       "qwen3_qk_norm",    "phi3_layout"};

// Writes `variant` into `dir` (emptied first); returns dir. Throws if the script fails.
inline std::string make_transformers_reference(const std::filesystem::path& dir,
                                               const std::string& variant) {
  std::filesystem::remove_all(dir);
  const std::string command = std::string(RETORT_PYTHON) + " " + RETORT_HF_TRANSFORMERS_SCRIPT +
                              " make " + dir.string() + " " + variant;
  if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
  return dir.string();
}

inline torch::Tensor reference_tensor(const std::string& dir, const std::string& name,
                                      torch::ScalarType dtype) {
  hf::SafetensorsFile file((std::filesystem::path(dir) / "reference.safetensors").string());
  const hf::StTensor* t = file.find(name);
  if (t == nullptr) throw std::runtime_error(dir + "/reference.safetensors has no " + name);
  torch::Tensor out = torch::empty(t->shape, torch::dtype(dtype));
  if (size_t(out.nbytes()) != size_t(t->end - t->begin))
    throw std::runtime_error(name + ": not of the type asked for");
  std::memcpy(out.data_ptr(), file.bytes(*t), t->end - t->begin);
  return out;
}

inline std::vector<int64_t> as_ids(const torch::Tensor& ids) {
  const torch::Tensor flat = ids.contiguous().view({-1});
  return std::vector<int64_t>(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
}

struct GreedyContinuations {
  std::vector<int64_t> transformers, ours;
};
// transformers' greedy generate() of the reference's prompt (its "generated"), and `model`'s
// greedy continuation of the same prompt for as many tokens, through the KV cache.
inline GreedyContinuations greedy_continuations(const layers::LlamaModel& model,
                                                const std::string& dir) {
  GreedyContinuations out;
  out.transformers = as_ids(reference_tensor(dir, "generated", torch::kLong));
  engine::SamplingOptions greedy;
  greedy.max_tokens = int64_t(out.transformers.size());
  greedy.temperature = 0;
  greedy.top_k = 0;
  out.ours = engine::generate(model, as_ids(reference_tensor(dir, "prompt", torch::kLong)), greedy);
  return out;
}

}  // namespace retort::testing
