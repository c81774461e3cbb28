// engine/config/precision_policy.cpp: see precision_policy.h.
#include "engine/config/precision_policy.h"

namespace retort::engine {

int64_t bytes_of(NumberType type) {
  switch (type) {
    case NumberType::float64:
      return 8;
    case NumberType::float32:
      return 4;
    case NumberType::bfloat16:
      return 2;
  }
  return 4;
}

const char* name_of(NumberType type) {
  switch (type) {
    case NumberType::float64:
      return "float64";
    case NumberType::float32:
      return "float32";
    case NumberType::bfloat16:
      return "bfloat16";
  }
  return "?";
}

PrecisionPolicy precision_policy(const TrainConfig& config) {
  PrecisionPolicy p;
  p.main = config.dtype == DType::float64 ? NumberType::float64 : NumberType::float32;
  p.compute = config.dtype == DType::bfloat16 ? NumberType::bfloat16 : p.main;
  p.residual = config.fp32_residual ? p.main : p.compute;
  // 16-bit products and softmaxes accumulate in float32; float32 and float64 in their own type.
  p.accumulation = p.compute == NumberType::bfloat16 ? NumberType::float32 : p.compute;
  p.tp_activation_sum = p.compute;
  p.dp_gradient_sum =
      config.parallel.dp_reduce_dtype == ReduceDType::bfloat16 ? NumberType::bfloat16 : p.main;
  p.pipeline_message = p.residual;
  return p;
}

std::string PrecisionPolicy::describe() const {
  return std::string("main ") + name_of(main) + ", compute " + name_of(compute) + ", residual " +
         name_of(residual) + ", accumulation " + name_of(accumulation) + "; sums: TP activations " +
         name_of(tp_activation_sum) + ", DP gradients " + name_of(dp_gradient_sum) +
         ", pipeline messages " + name_of(pipeline_message);
}

}  // namespace retort::engine
