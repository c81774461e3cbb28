// engine/optim/grad_hooks.cpp: see grad_hooks.h.
#include "engine/optim/grad_hooks.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

namespace retort::engine {
namespace {

struct PostAccumulateHook : torch::autograd::FunctionPostHook {
  PostAccumulateHook(std::shared_ptr<GradReadyHooks::Callback> callback, size_t index)
      : callback(std::move(callback)), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    (*callback)(index);
    return outputs;
  }
  std::shared_ptr<GradReadyHooks::Callback> callback;
  size_t index;
};

}  // namespace

GradReadyHooks::GradReadyHooks(layers::ParameterStore& store, Callback callback)
    : callback_(std::make_shared<Callback>(std::move(callback))) {
  for (size_t i = 0; i < store.all().size(); ++i) {
    const layers::Parameter& p = store.all()[i];
    if (p.spec.frozen()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(p.value);
    accumulator->add_post_hook(std::make_unique<PostAccumulateHook>(callback_, i));
    accumulators_.push_back(std::move(accumulator));
  }
}

}  // namespace retort::engine
