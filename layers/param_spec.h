// layers/param_spec.h: the description every parameter carries (docs/architecture.md): stable
// global name, global shape, TP shard dimension, sequence-parallel replication, init method and
// learning-rate scale. Initialisation, checkpoints, freezing, optimizer groups and the
// consistency suite all read this one description. Plain C++.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace retort::layers {

enum class InitMethod { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;                  // e.g. "layers.3.attn.q_proj.weight"
  std::vector<int64_t> shape;        // global shape, before any tensor-parallel split
  int shard_dim = -1;                // dimension split over TP ranks; -1 = replicated
  bool sequence_replicated = false;  // replicated across a sequence-parallel TP group
  InitMethod init = InitMethod::Normal;
  double init_std = 0.02;  // for InitMethod::Normal
  // Replicated on every TP rank, but each rank's gradient is only its part (kv heads shared
  // by several TP ranks): the gradient is summed over TP whatever the sequence mode.
  bool tp_partial_grad = false;
  int64_t padded_rows = 0;   // dim 0 padded with zero rows to this size (vocab); 0 = none
  double lr_scale = 1.0;     // 0 = frozen
  bool weight_decay = true;  // false for norms and biases
  // A second copy of a parameter another pipeline stage owns (the tied LM head on the last
  // stage): its gradient is summed with the owner's over the embedding group, it is counted
  // once in the gradient norm (on the owner) and written to checkpoints by the owner only.
  bool tied_copy = false;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  bool frozen() const { return lr_scale == 0.0; }
  // Whether this parameter's gradient must be summed over the TP group.
  bool needs_tp_grad_sum(bool sequence_parallel) const {
    return tp_partial_grad || (sequence_parallel && sequence_replicated);
  }
  // The shape stored on a rank before any TP split: the global shape with padding.
  std::vector<int64_t> padded_shape() const {
    std::vector<int64_t> s = shape;
    if (padded_rows > 0) s[0] = padded_rows;
    return s;
  }
};

// A seed for the generator of one parameter, from the run seed and the global name only,
// so a parameter starts equal whatever the layout or the order of construction.
uint64_t parameter_seed(uint64_t run_seed, const std::string& name);

}  // namespace retort::layers
