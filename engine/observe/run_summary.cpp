// engine/observe/run_summary.cpp: see run_summary.h.
#include "engine/observe/run_summary.h"

#include <algorithm>
#include <sstream>

#include "engine/config/precision_policy.h"
#include "engine/observe/metrics.h"

namespace retort::engine {

MemoryEstimate estimate_memory(const TrainConfig& c) {
  const layers::ModelConfig& m = c.model;
  // Main weights, gradients and AdamW state in the main type; under mixed precision the
  // weights' compute copies come on top, and the activations take the compute type.
  const PrecisionPolicy precision = precision_policy(c);
  const int64_t bytes = bytes_of(precision.main);
  const int64_t activation_bytes = bytes_of(precision.compute);
  const int64_t shards = c.layout.tensor * c.layout.pipeline;
  const int64_t params = m.parameter_count() / shards;
  MemoryEstimate e;
  e.weights = params * (bytes + (precision.mixed() ? activation_bytes : 0));
  e.gradients = params * bytes;
  e.optimizer = 2 * params * bytes;
  // Saved for backward per token and layer: the block's inputs and normed inputs, q, k, v
  // and their rotated copies, attention output, scores and probabilities over the keys a
  // query sees, and the MLP's gate, up, activation and product.
  const int64_t s = c.data.seq_len, h = m.hidden, f = m.ffn_hidden;
  const int64_t kv = m.kv_heads * m.head_dim();
  const int64_t per_token_layer = 6 * h + 4 * kv + 2 * m.heads * s + 4 * f;
  const int64_t per_token = m.layers * per_token_layer / shards + 3 * m.vocab_size;
  // Under 1F1B the first stage keeps up to p micro-batches in flight.
  const int64_t in_flight = std::min<int64_t>(c.layout.pipeline, c.accumulation_steps());
  e.activations = in_flight * c.training.micro_batch * s * per_token * activation_bytes;
  return e;
}

std::string run_summary(const TrainConfig& c) {
  std::ostringstream os;
  const MemoryEstimate mem = estimate_memory(c);
  os << "layout:            " << parallel::describe(c.layout) << "\n"
     << "parameters:        " << c.model.parameter_count() << " ("
     << c.model.matmul_parameter_count() << " in matrix products)\n"
     << "FLOPs per token:   " << c.model.training_flops_per_token(c.data.seq_len)
     << " (training, forward + backward)\n"
     << "micro-batches:     " << c.accumulation_steps() << " per step per rank\n"
     << "number types:      " << precision_policy(c).describe() << "\n";
  if (c.layout.pipeline > 1) {
    os << "layers per stage: ";
    for (const parallel::LayerRange& r : c.stages)
      os << " " << r.size() << " [" << r.first << "-" << r.end - 1 << "]";
    os << " (1F1B)\n";
  }
  os << "tokens per step:   " << c.training.global_batch * c.data.seq_len << "\n"
     << "memory per rank (estimate): " << format_bytes(mem.total()) << " = weights "
     << format_bytes(mem.weights) << " + gradients " << format_bytes(mem.gradients)
     << " + AdamW state " << format_bytes(mem.optimizer) << " + activations "
     << format_bytes(mem.activations) << "\n";
  return os.str();
}

}  // namespace retort::engine
