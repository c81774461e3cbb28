// engine/train/keys_without_effect.cpp: see keys_without_effect.h.
#include "engine/train/keys_without_effect.h"

namespace retort::engine {

std::vector<std::string> keys_without_effect(const TrainConfig& c, const RunFacts& facts) {
  std::vector<std::string> lines;
  const bool bf16 = c.dtype == DType::bfloat16;
  if (!c.memory.keep_compute_weights && !bf16)
    lines.push_back(
        "memory.keep_compute_weights=false has no effect: the weights are used in their own "
        "type (it applies under model.dtype=bfloat16)");
  if (c.memory.defer_head_gradient && !facts.head_gradient_deferred)
    lines.push_back(
        "memory.defer_head_gradient does not apply here, or not to the last micro-batch: it "
        "applies to the LM loss's fused head tied to the embedding on one stage, without "
        "optimizer.in_backward, and under DP > 1 to the micro-batches before the last");
  if (c.fp32_residual && !bf16)
    lines.push_back(
        "model.fp32_residual has no effect: the residual stream is already in the model's "
        "type (it applies under model.dtype=bfloat16)");
  if (!facts.on_gpu && c.runtime.gpus_per_node != 0)
    lines.push_back("runtime.gpus_per_node has no effect: this run is on the CPU (runtime.device)");
  if (!facts.on_gpu && c.parallel.gpu_transport == GpuTransport::nccl)
    lines.push_back(
        "parallel.gpu_transport=nccl has no effect: this run's tensors are on the CPU, which "
        "MPI moves");
  if (c.parallel.p2p_rules == P2pRules::nccl && c.parallel.pipeline == 1)
    lines.push_back(
        "parallel.p2p_rules=nccl has no effect: there is no pipeline (parallel.pipeline=1)");
  if (c.parallel.dp_reduce_dtype == ReduceDType::bfloat16 &&
      (facts.dp_size == 1 || facts.dp_sum_in_shared_memory))
    lines.push_back(std::string("parallel.dp_reduce_dtype=bfloat16 has no effect: ") +
                    (facts.dp_size == 1 ? "there is no DP sum (parallel.data=1)"
                                        : "the DP sum runs in shared memory, in float32 (set "
                                          "parallel.dp_shared_memory=false for MPI's)"));
  const distill::DistillConfig& objective = c.distill.objective;
  if (objective.activation_weight == 0 &&
      (!objective.pair_names.empty() || !objective.every_layer_points.empty()))
    lines.push_back(
        "distill.activation_pairs / activation_points have no effect: "
        "distill.activation_weight is 0");
  if (!c.distill.keys.cache.empty() && objective.logit_weight == 0)
    lines.push_back(
        "teacher.cache has no effect: there is no logit loss (distill.logit_weight is 0)");
  if (objective.logits.top_k_tail != distill::TopKTail::renormalise && c.distill.keys.cache.empty())
    lines.push_back(
        "distill.top_k_tail has no effect: it applies to a teacher read from teacher.cache");
  return lines;
}

}  // namespace retort::engine
