// engine/generate/generator.cpp: see generator.h.
#include "engine/generate/generator.h"

#include "common/machine_memory.h"
#include "common/user_error.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/hf/hf_model.h"
#include "layers/tensor_parallel.h"

namespace retort::engine {
namespace {

// The last position's logits over the whole vocabulary [vocab], on every TP rank, on the host.
torch::Tensor last_logits(const torch::Tensor& local_logits, const layers::LlamaModel& model) {
  torch::Tensor last = local_logits.select(1, -1).select(0, 0).contiguous();  // [padded / tp]
  const layers::TensorParallel& tp = model.tensor_parallel();
  if (tp.size() > 1) last = tp.group->all_gather(last, 0);
  return last.narrow(0, 0, model.config().vocab_size).cpu();
}

// ids as a [1, n] batch on the model's device.
torch::Tensor as_batch(const std::vector<int64_t>& ids, const layers::LlamaModel& model) {
  return torch::tensor(ids, torch::kLong).view({1, -1}).to(model.head_weight().device());
}

}  // namespace

InferenceModel load_inference_model(const std::string& path, parallel::Mesh& mesh,
                                    torch::ScalarType dtype, torch::Device device) {
  InferenceModel m;
  const bool hf = hf::is_hf_model_dir(path);
  m.source = hf ? path : resolve_checkpoint(path);
  if (hf) {
    m.config = hf::read_hf_config(path);
    m.trained_context = hf::read_hf_max_positions(path);
  } else {
    std::optional<layers::ModelConfig> stored = read_checkpoint_model(m.source);
    if (!stored) throw UserError("checkpoint '" + m.source + "' does not record its model shape");
    m.config = *stored;
    m.trained_context = read_checkpoint_seq_len(m.source);
  }
  layers::TensorParallel tp;
  tp.group = &mesh.tp();
  if (m.config.heads % tp.size() != 0 || m.config.ffn_hidden % tp.size() != 0)
    throw UserError("the model's " + std::to_string(m.config.heads) + " heads and ffn " +
                    std::to_string(m.config.ffn_hidden) + " do not split over " +
                    std::to_string(tp.size()) + " TP ranks");
  if (device.is_cpu())
    require_memory(m.config.parameter_count() / tp.size() * int64_t(torch::elementSize(dtype)),
                   mesh.ranks_on_host(), "the model of '" + m.source + "'");
  m.store = std::make_unique<layers::ParameterStore>(0, dtype, tp.position(), device);
  m.model = std::make_unique<layers::LlamaModel>(m.config, *m.store, tp);
  if (hf)
    hf::load_hf_parameters(path, m.config, *m.store, tp);
  else
    load_checkpoint(m.source, mesh, *m.store, nullptr);
  return m;
}

int64_t sample_token(const torch::Tensor& logits, const SamplingOptions& options,
                     at::Generator& generator) {
  if (options.temperature <= 0) return logits.argmax().item<int64_t>();
  torch::Tensor scaled = logits.to(torch::kDouble) / options.temperature;
  if (options.top_k > 0 && options.top_k < scaled.numel()) {
    const double kth = std::get<0>(scaled.topk(options.top_k)).min().item<double>();
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<double>::infinity());
  }
  torch::Tensor probs = torch::softmax(scaled, 0);
  return torch::multinomial(probs, 1, false, generator).item<int64_t>();
}

std::vector<int64_t> generate(const layers::LlamaModel& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options, bool use_cache) {
  if (prompt.empty()) throw UserError("the prompt is empty: generation needs a first token");
  if (options.context == 1) throw UserError("a context of 1 position cannot slide");
  torch::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(options.seed);
  const layers::TensorParallel& tp = model.tensor_parallel();
  const int64_t limit =
      options.context > 0 ? options.context : int64_t(prompt.size()) + options.max_tokens;
  // The positions the model sees: the tail of the text, at most `limit` long.
  std::vector<int64_t> window(prompt.end() - std::min<int64_t>(int64_t(prompt.size()), limit),
                              prompt.end());
  std::vector<int64_t> generated;
  layers::KvCache cache;
  cache.capacity = limit;
  torch::Tensor logits = use_cache ? model.forward_cached(as_batch(window, model), cache)
                                   : model.forward(as_batch(window, model));
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    torch::Tensor choice =
        torch::tensor({sample_token(last_logits(logits, model), options, generator)}, torch::kLong);
    if (tp.size() > 1) tp.group->broadcast(choice, 0);  // every rank continues alike
    const int64_t token = choice.item<int64_t>();
    if (options.stop_token && token == *options.stop_token) break;
    generated.push_back(token);
    if (i + 1 == options.max_tokens) break;
    if (int64_t(window.size()) == limit) {  // full: keep the second half, run it again
      window.erase(window.begin(), window.begin() + limit / 2);
      cache = layers::KvCache();
      cache.capacity = limit;
      window.push_back(token);
      logits = use_cache ? model.forward_cached(as_batch(window, model), cache)
                         : model.forward(as_batch(window, model));
      continue;
    }
    window.push_back(token);
    logits = use_cache ? model.forward_cached(as_batch({token}, model), cache)
                       : model.forward(as_batch(window, model));
  }
  return generated;
}

}  // namespace retort::engine
