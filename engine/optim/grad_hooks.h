// engine/optim/grad_hooks.h: one callback per parameter fired as soon as its gradient has been
// accumulated into .grad() during backward (a post-hook on the parameter's AccumulateGrad
// node). The single piece of hook machinery shared by data-parallel bucketing and, later,
// the optimizer step inside backward.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "layers/parameters.h"

namespace retort::engine {

class GradReadyHooks {
 public:
  using Callback = std::function<void(size_t parameter_index)>;
  // Hooks every trainable parameter of the store.
  GradReadyHooks(layers::ParameterStore& store, Callback callback);

 private:
  // The accumulators are held weakly by their parameters; keep them alive here.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::shared_ptr<Callback> callback_;
};

}  // namespace retort::engine
