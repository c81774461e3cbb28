// engine/config/precision_policy.h: the number types of a run, decided once from its config
// (model.dtype, model.fp32_residual, parallel.dp_reduce_dtype) and read by the trainer, the
// planner and the run summary, so the rules are written in one place:
// - main: the parameters the optimizer steps, their gradients, AdamW's state, checkpoints;
// - compute: the products and activations, and the teacher's weights (bf16 under mixed
//   precision, else main);
// - residual: the residual stream (main under model.fp32_residual, else compute);
// - accumulation: what products, softmaxes and losses accumulate in (float32 under bf16);
// - the sums by purpose: tensor-parallel activation sums travel and add in the compute type
//   (as NCCL sums them, parallel/primitives.cpp), data-parallel gradient sums in main unless
//   parallel.dp_reduce_dtype=bfloat16, pipeline messages in the residual type.
// No torch here (the trainer maps the types to torch's).
#pragma once
#include <cstdint>
#include <string>

#include "engine/config/train_config.h"

namespace retort::engine {

enum class NumberType { float64, float32, bfloat16 };

int64_t bytes_of(NumberType type);
const char* name_of(NumberType type);

struct PrecisionPolicy {
  NumberType main = NumberType::float32;
  NumberType compute = NumberType::float32;
  NumberType residual = NumberType::float32;
  NumberType accumulation = NumberType::float32;
  NumberType tp_activation_sum = NumberType::float32;
  NumberType dp_gradient_sum = NumberType::float32;
  NumberType pipeline_message = NumberType::float32;

  // Mixed precision: the products run in a narrower type than the main weights, which then
  // have compute copies beside them (layers/compute_copy.h).
  bool mixed() const { return compute != main; }
  // One line for the run summary, e.g. "main float32, compute bfloat16, ...".
  std::string describe() const;
};

PrecisionPolicy precision_policy(const TrainConfig& config);

}  // namespace retort::engine
