// engine/grad_sync.h: making gradients whole across ranks after backward.
//  - TP: parameters replicated over a TP group whose per-rank gradients are partial
//    (norms under sequence parallel, kv weights shared by several ranks) are summed.
//  - DP: gradients are summed over data-parallel ranks in buckets; a bucket's non-blocking
//    all-reduce is launched from the grad-ready hook of its last parameter during the final
//    micro-batch's backward, so communication overlaps the rest of backward.
//  - PP with tied embeddings: the first stage's embedding and the last stage's copy (the LM
//    head) sum their gradients over the embedding group, so both step identically.
// Losses are already divided by the global token count, so sums are exact averages.
#pragma once
#include <memory>
#include <vector>

#include "engine/grad_hooks.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"
#include "parallel/communicator.h"

namespace retort::engine {

void sum_partial_tp_grads(layers::ParameterStore& store, const layers::TensorParallel& tp);

// Sums the gradient of `name` over `embedding` (first and last pipeline stage). Every member
// must hold the parameter; a frozen one is skipped on all of them alike.
void sum_tied_grads(layers::ParameterStore& store, const std::string& name,
                    parallel::Communicator& embedding);

class DataParallelGradSync {
 public:
  DataParallelGradSync(layers::ParameterStore& store, parallel::Communicator& dp,
                       int64_t bucket_bytes);
  // Arms the hooks for the backward of the last micro-batch of a step.
  void arm() { armed_ = true; }
  // Launches what has not been launched, waits for every bucket and writes the sums back.
  void finish();
  size_t bucket_count() const { return buckets_.size(); }
  int64_t launched_during_backward() const { return launched_early_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    torch::Tensor buffer;
    int ready = 0;
    parallel::Handle handle;
    bool launched = false;
  };
  void on_grad_ready(size_t param);
  void launch(Bucket& bucket);

  layers::ParameterStore& store_;
  parallel::Communicator& dp_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  bool armed_ = false;
  int64_t launched_early_ = 0;
  std::unique_ptr<GradReadyHooks> hooks_;
};

}  // namespace retort::engine
