// engine/generate/generator.h: text generation from a trained model. A model is loaded for
// inference from a Retort checkpoint (or its run directory) or a Hugging Face directory,
// its layers split over the TP group of `mesh` (no sequence parallelism). Generation runs
// the prompt once, then one token at a time through the KV cache (layers/kv_cache.h), so
// each new token costs one position's work; `use_cache=false` recomputes the whole prefix
// at every token instead (the reference the cache is tested against). Sampling: greedy at
// temperature 0, else softmax(logits / T) over the top-k tokens (k = 0: all), from a
// generator seeded identically everywhere; under TP the logits are gathered whole and TP
// rank 0's choice is broadcast, so every rank continues the same text. On a GPU the model runs
// there and only each step's last logits come to the host, where sampling is the CPU's.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/model.h"
#include "layers/parameters.h"
#include "parallel/mesh.h"

namespace retort::engine {

struct InferenceModel {
  layers::ModelConfig config;
  std::unique_ptr<layers::ParameterStore> store;
  std::unique_ptr<layers::LlamaModel> model;
  std::string source;  // the checkpoint or directory it came from
  // The positions it was trained on (a checkpoint's seq_len, config.json's
  // max_position_embeddings); 0 = not recorded.
  int64_t trained_context = 0;
};

// Collective over mesh (its layout must be TP only). dtype: kFloat or kDouble. The parameters
// are read on the host and placed on `device`; generation then runs there.
InferenceModel load_inference_model(const std::string& path, parallel::Mesh& mesh,
                                    torch::ScalarType dtype = torch::kFloat,
                                    torch::Device device = torch::kCPU);

struct SamplingOptions {
  int64_t max_tokens = 64;
  double temperature = 0.8;
  int64_t top_k = 40;  // 0 = the whole vocabulary
  uint64_t seed = 1234;
  std::optional<int64_t> stop_token;  // ends generation when sampled (not returned)
  // At most this many positions go through the model (the length it was trained on); a
  // longer text slides: when the window is full, its second half is run again as a new
  // prompt. 0 = no limit.
  int64_t context = 0;
};

// The ids generated after `prompt` (at most max_tokens). Collective over the model's TP group.
std::vector<int64_t> generate(const layers::LlamaModel& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options, bool use_cache = true);

// One token from whole-vocabulary logits [vocab] (see the header comment).
int64_t sample_token(const torch::Tensor& logits, const SamplingOptions& options,
                     at::Generator& generator);

}  // namespace retort::engine
