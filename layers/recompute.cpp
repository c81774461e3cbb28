// layers/recompute.cpp: see recompute.h.
#include "layers/recompute.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "common/memory_category.h"

namespace retort::layers {
namespace {

// The stream the caller's kernels run on for `device` (torch's current one).
c10::Stream compute_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Everything backward needs, held by the autograd context.
struct RecomputeState : torch::CustomClassHolder {
  RecomputeFn fn;
  ActivationOffloader* offloader = nullptr;
  std::vector<torch::Tensor> kept;  // the inputs, unless offloaded
  int64_t slot = -1;                // the offloaded inputs
  std::vector<bool> requires_grad;
};

struct Recompute : torch::autograd::Function<Recompute> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs,
                               c10::intrusive_ptr<RecomputeState> state) {
    std::vector<torch::Tensor> in(inputs.begin(), inputs.end());
    variable_list outputs;
    {
      MemoryScope activations(MemoryCategory::activations);
      outputs = state->fn(in);
    }
    for (const torch::Tensor& t : in) state->requires_grad.push_back(t.requires_grad());
    if (state->offloader)
      state->slot = state->offloader->put(in);
    else
      state->kept = std::move(in);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state =
        c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    std::vector<torch::Tensor> inputs =
        state->offloader ? state->offloader->take(state->slot) : std::move(state->kept);
    std::vector<torch::Tensor> leaves;
    for (size_t i = 0; i < inputs.size(); ++i)
      leaves.push_back(inputs[i].detach().requires_grad_(state->requires_grad[i]));
    inputs.clear();
    std::vector<torch::Tensor> outputs, seeds;
    {
      torch::AutoGradMode grad_on(true);
      MemoryScope activations(MemoryCategory::activations);
      std::vector<torch::Tensor> recomputed = state->fn(leaves);
      for (size_t i = 0; i < recomputed.size(); ++i)
        if (grads[i].defined() && recomputed[i].requires_grad()) {
          outputs.push_back(recomputed[i]);
          seeds.push_back(grads[i]);
        }
    }
    // Accumulates into the leaves' .grad() and into the parameters fn used.
    if (!outputs.empty()) torch::autograd::backward(outputs, seeds);
    variable_list input_grads;
    for (const torch::Tensor& leaf : leaves)
      input_grads.push_back(leaf.requires_grad() ? leaf.grad() : torch::Tensor());
    input_grads.emplace_back();  // the state argument
    return input_grads;
  }
};

}  // namespace

int64_t ActivationOffloader::put(const std::vector<torch::Tensor>& tensors) {
  Slot slot;
  if (!tensors.empty() && !tensors.front().device().is_cpu()) {
    copy_out(tensors, slot);
  } else {
    MemoryScope host(MemoryCategory::offloaded);
    for (const torch::Tensor& t : tensors) slot.tensors.push_back(t.detach().clone());
  }
  moved_out_ += int64_t(tensors.size());
  slot.previous = last_put_;
  last_put_ = next_slot_++;
  slots_.emplace(last_put_, std::move(slot));
  return last_put_;
}

void ActivationOffloader::copy_out(const std::vector<torch::Tensor>& tensors, Slot& slot) {
  slot.device = tensors.front().device();
  const c10::Stream compute = compute_stream(slot.device);
  if (!side_)
    side_ = c10::impl::VirtualGuardImpl(slot.device.type())
                .getStreamFromGlobalPool(slot.device, /*isHighPriority=*/false);
  // The copies wait for the kernels that produced the tensors, not for anything after them.
  c10::Event produced(slot.device.type());
  produced.record(compute);
  produced.block(*side_);
  {
    const c10::StreamGuard on_side(*side_);
    MemoryScope host(MemoryCategory::offloaded);
    for (const torch::Tensor& t : tensors) {
      torch::Tensor pinned =
          torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
      pinned.copy_(t.detach(), /*non_blocking=*/true);
      // The caller lets t go now: its memory must not be reused before this copy read it.
      t.record_stream(*side_);
      slot.tensors.push_back(pinned);
    }
  }
  slot.copied.emplace(slot.device.type());
  slot.copied->record(*side_);
}

void ActivationOffloader::bring_back(Slot& slot) {
  MemoryScope device(MemoryCategory::activations);
  if (slot.device.is_cpu()) {
    for (torch::Tensor& t : slot.tensors) t = t.clone();  // the host copy is released
  } else {
    // After the copy out on the same stream; the pinned buffers go back to torch's host
    // allocator, which keeps them until this copy has read them.
    const c10::Stream compute = compute_stream(slot.device);
    const c10::StreamGuard on_side(*side_);
    for (torch::Tensor& t : slot.tensors) {
      torch::Tensor back =
          torch::empty(t.sizes(), t.options().device(slot.device).pinned_memory(false));
      back.copy_(t, /*non_blocking=*/true);
      back.record_stream(compute);  // made on the side stream, used on the compute stream
      t = back;
    }
    slot.copied.emplace(slot.device.type());
    slot.copied->record(*side_);
  }
  moved_back_ += int64_t(slot.tensors.size());
  slot.on_host = false;
}

std::vector<torch::Tensor> ActivationOffloader::take(int64_t id) {
  auto it = slots_.find(id);
  TORCH_CHECK(it != slots_.end(), "activation offloading: slot ", id, " was taken already");
  Slot slot = std::move(it->second);
  slots_.erase(it);
  if (slot.on_host)
    bring_back(slot);
  else
    ++prefetch_hits_;
  // One ahead: the predecessor's recomputation runs next in backward.
  auto previous = slots_.find(slot.previous);
  if (previous != slots_.end() && previous->second.on_host) bring_back(previous->second);
  // The compute stream waits for this slot's copy back only.
  if (slot.copied) slot.copied->block(compute_stream(slot.device));
  return std::move(slot.tensors);
}

bool RecomputePolicy::active(Checkpointing wanted) const {
  return mode == wanted && torch::GradMode::is_enabled();
}

std::vector<torch::Tensor> run_recomputed(const RecomputeFn& fn,
                                          const std::vector<torch::Tensor>& inputs,
                                          ActivationOffloader* offloader) {
  auto state = c10::make_intrusive<RecomputeState>();
  state->fn = fn;
  state->offloader = offloader;
  // A grad-requiring anchor, so the outputs require grad (and backward reaches fn's
  // parameters) even when no input does.
  std::vector<torch::Tensor> with_anchor = inputs;
  with_anchor.push_back(torch::empty({0}, inputs.at(0).options()).requires_grad_(true));
  return Recompute::apply(at::TensorList(with_anchor), state);
}

}  // namespace retort::layers
