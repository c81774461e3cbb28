// layers/parameters.h: the parameter store. Each Parameter pairs its ParamSpec with the
// local tensor (this rank's shard); layers keep handles to the same tensors. Initial values
// are generated at global shape from (seed, name) and then sliced to the local shard.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/param_spec.h"

namespace retort::layers {

struct Parameter {
  ParamSpec spec;
  torch::Tensor value;  // local shard, requires_grad unless frozen
};

// Which slice of a global tensor this rank holds.
struct ShardPosition {
  int rank = 0;
  int size = 1;
};

class ParameterStore {
 public:
  // Parameters are initialised on the CPU (layout-independent values from the seed) and then
  // placed on `device`.
  ParameterStore(uint64_t seed, torch::ScalarType dtype, ShardPosition tp = {},
                 torch::Device device = torch::kCPU);

  // Creates, initialises and registers a parameter; returns its local tensor. The spec's
  // lr_scale is replaced by the rule's value when a rule is set (freezing by name).
  torch::Tensor create(const ParamSpec& spec);
  void set_lr_scale_rule(std::function<double(const std::string& name)> rule) {
    lr_scale_rule_ = std::move(rule);
  }

  std::vector<Parameter>& all() { return params_; }
  const std::vector<Parameter>& all() const { return params_; }
  Parameter* find(const std::string& name);
  const Parameter* find(const std::string& name) const;
  ShardPosition tp() const { return tp_; }
  uint64_t seed() const { return seed_; }
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

 private:
  uint64_t seed_;
  torch::ScalarType dtype_;
  torch::Device device_;
  ShardPosition tp_;
  std::vector<Parameter> params_;
  std::function<double(const std::string&)> lr_scale_rule_;
};

// The value a parameter starts from, at global shape, in float32.
torch::Tensor initial_global_value(const ParamSpec& spec, uint64_t run_seed);
// Appends the spec's zero padding rows (vocabulary padding) to a global tensor.
torch::Tensor pad_rows(const torch::Tensor& global, const ParamSpec& spec);
// This rank's slice of a (padded) global tensor along the spec's shard dimension.
torch::Tensor local_shard(const torch::Tensor& global, const ParamSpec& spec, ShardPosition tp);

}  // namespace retort::layers
