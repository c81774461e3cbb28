// layers/recompute.h: activation checkpointing and offloading for our own autograd graph.
// run_recomputed(fn, inputs) runs fn without keeping its graph and keeps only the inputs;
// backward runs fn again with grad enabled on those inputs and backpropagates through it,
// accumulating the gradients of the parameters fn uses into their .grad() (as PyTorch's
// reentrant checkpoint does) and returning the inputs' gradients. fn must be a pure function
// of its inputs and what it captures (no randomness), so the recomputation is exact.
//
// The kept inputs may go to an ActivationOffloader instead: a host store they move into as
// soon as the forward is done with them, and come back from one recomputation ahead in
// backward. (libtorch 1.13 has no C++ saved-tensor hooks, so only what our recompute
// functions keep can be moved; the tensors autograd saves itself stay where they are.)
// For CPU tensors the host store is separate, accounted memory (category `offloaded`). For
// GPU tensors it is pinned host memory: the copies run on a side stream, out waiting for the
// kernels that produced the tensors and back one recomputation ahead, and events make the
// compute stream wait only for the copy back of what it is about to use.
#pragma once
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "layers/memory_config.h"

namespace retort::layers {

class ActivationOffloader {
 public:
  // Starts a new chain: the next put() has no predecessor (one stage's forward of one
  // micro-batch is one chain; backward walks it in reverse).
  void begin_chain() { last_put_ = -1; }
  // Moves tensors to the host store; returns their slot.
  int64_t put(const std::vector<torch::Tensor>& tensors);
  // Brings a slot's tensors back (already back if prefetched) and prefetches its
  // predecessor in the chain, the next one backward needs.
  std::vector<torch::Tensor> take(int64_t slot);
  // Slots stored or prefetched and not taken yet.
  size_t pending() const { return slots_.size(); }
  // Counters for tests: tensors moved each way, and takes served by a prefetch.
  int64_t moved_out() const { return moved_out_; }
  int64_t moved_back() const { return moved_back_; }
  int64_t prefetch_hits() const { return prefetch_hits_; }

 private:
  struct Slot {
    std::vector<torch::Tensor> tensors;
    bool on_host = true;
    int64_t previous = -1;
    c10::Device device = c10::kCPU;    // where the tensors came from
    std::optional<c10::Event> copied;  // GPU: the side stream's last copy of this slot
  };
  // GPU tensors: pinned host copies made on the side stream.
  void copy_out(const std::vector<torch::Tensor>& tensors, Slot& slot);
  void bring_back(Slot& slot);

  std::map<int64_t, Slot> slots_;
  std::optional<c10::Stream> side_;  // GPU: the stream the copies run on
  int64_t next_slot_ = 0, last_put_ = -1;
  int64_t moved_out_ = 0, moved_back_ = 0, prefetch_hits_ = 0;
};

// What blocks do about the tensors backward needs.
struct RecomputePolicy {
  Checkpointing mode = Checkpointing::none;
  ActivationOffloader* offloader = nullptr;  // non-null: offload what recomputation keeps
  // Whether recomputation applies now (grad mode on: evaluation keeps nothing anyway).
  bool active(Checkpointing wanted) const;
};

using RecomputeFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// fn(inputs) whose backward recomputes fn. The outputs require grad whenever backward may
// reach parameters inside fn, even if no input requires grad (a frozen embedding).
std::vector<torch::Tensor> run_recomputed(const RecomputeFn& fn,
                                          const std::vector<torch::Tensor>& inputs,
                                          ActivationOffloader* offloader);

}  // namespace retort::layers
