// layers/parameters.cpp: see parameters.h.
#include "layers/parameters.h"

#include <ATen/CPUGeneratorImpl.h>

namespace retort::layers {

torch::Tensor initial_global_value(const ParamSpec& spec, uint64_t run_seed) {
  auto options = torch::TensorOptions().dtype(torch::kFloat32);
  switch (spec.init) {
    case InitMethod::Zeros:
      return torch::zeros(spec.shape, options);
    case InitMethod::Ones:
      return torch::ones(spec.shape, options);
    case InitMethod::Normal: {
      auto generator = at::detail::createCPUGenerator(parameter_seed(run_seed, spec.name));
      return torch::randn(spec.shape, generator, options) * spec.init_std;
    }
  }
  return {};
}

torch::Tensor pad_rows(const torch::Tensor& global, const ParamSpec& spec) {
  if (spec.padded_rows <= global.size(0)) return global;
  std::vector<int64_t> pad_shape = global.sizes().vec();
  pad_shape[0] = spec.padded_rows - global.size(0);
  return torch::cat({global, torch::zeros(pad_shape, global.options())}, 0);
}

torch::Tensor local_shard(const torch::Tensor& global, const ParamSpec& spec, ShardPosition tp) {
  if (spec.shard_dim < 0 || tp.size == 1) return global;
  const int64_t extent = global.size(spec.shard_dim);
  TORCH_CHECK(extent % tp.size == 0, spec.name, ": dim ", spec.shard_dim, " of size ", extent,
              " does not split over ", tp.size, " ranks");
  const int64_t part = extent / tp.size;
  return global.narrow(spec.shard_dim, tp.rank * part, part).contiguous();
}

ParameterStore::ParameterStore(uint64_t seed, torch::ScalarType dtype, ShardPosition tp,
                               torch::Device device)
    : seed_(seed), dtype_(dtype), device_(device), tp_(tp) {}

torch::Tensor ParameterStore::create(const ParamSpec& given) {
  TORCH_CHECK(find(given.name) == nullptr, "parameter registered twice: ", given.name);
  ParamSpec spec = given;
  if (lr_scale_rule_) spec.lr_scale = lr_scale_rule_(spec.name);
  torch::Tensor value = local_shard(pad_rows(initial_global_value(spec, seed_), spec), spec, tp_)
                            .to(device_, dtype_)
                            .contiguous();
  // local_shard narrows the whole initial value: a shard along rows is a contiguous view,
  // which would keep every rank holding the whole value (its storage, and the base the view
  // remembers even after place_adjacent moves the data) for the run.
  if (value.storage().nbytes() > size_t(value.numel() * value.element_size()))
    value = value.clone();
  value.set_requires_grad(!spec.frozen());
  params_.push_back({spec, value});
  return value;
}

Parameter* ParameterStore::find(const std::string& name) {
  for (auto& p : params_)
    if (p.spec.name == name) return &p;
  return nullptr;
}

const Parameter* ParameterStore::find(const std::string& name) const {
  return const_cast<ParameterStore*>(this)->find(name);
}

}  // namespace retort::layers
