// engine/optim/grad_sync.h: making gradients whole across ranks after backward, in one
// object with one ordering rule. The trainable parameters are grouped into buckets (filled
// in reverse creation order, the order backward reaches them); a bucket is finished by
//   1. the tied-embedding sum over the embedding group (first and last pipeline stage),
//   2. the TP partial sums (parameters replicated over TP whose per-rank gradients are
//      partial: norms under sequence parallel, kv weights shared by several ranks),
//   3. the DP reduction: an all-reduce, or under ZeRO-1 a reduce-scatter that leaves each
//      parameter's DP sum on its owner only (other ranks drop that gradient).
// All three are sums, so the order is free mathematically; tied before TP before DP is the
// order that every layout can run one bucket at a time. Losses are already divided by the
// global token count, so sums are exact averages.
// During the last micro-batch's backward (arm()), a bucket whose parameters' gradients are
// all final is finished from the grad-ready hook of its last parameter, so communication
// overlaps the rest of backward; finish() completes the rest and waits. The tied embedding
// is a bucket of its own that only finish() completes: its sum needs the other stage's
// backward. on_final (set by optimizer-in-backward) is called per parameter once final; with
// complete_in_backward the hooks are installed at any DP size and a bucket is also completed
// (its reduction waited for, on_final called) during backward as soon as its communication
// is done, so the parameters step and free their gradients while backward continues.
// When the DP ranks share memory (no ZeRO), step 3 goes through shared memory
// (parallel/shared_reduction.h; across hosts, with the same number of DP ranks on each, within
// each host and then over MPI between them): offer_gradient_memory() offers each parameter's place
// in this rank's region to the products that form weight gradients (layers/grad_destinations.h), so
// most gradients are formed there and need no copy; the others are copied in at launch. After the
// sum the bucket's gradients are views of that region until the next step clears them.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/optim/grad_hooks.h"
#include "engine/optim/zero_partition.h"
#include "layers/grad_destinations.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"
#include "parallel/mesh.h"
#include "parallel/shared_reduction.h"

namespace retort::engine {

// The TP partial sum of these parameters' gradients, in one flat all-reduce.
void sum_partial_tp_grads(const std::vector<layers::Parameter*>& params,
                          const layers::TensorParallel& tp);
// The same for every parameter of the store that needs it.
void sum_partial_tp_grads(layers::ParameterStore& store, const layers::TensorParallel& tp);

struct GradSyncOptions {
  int64_t bucket_bytes = 4'000'000;
  bool zero = false;                  // ZeRO-1 over DP: reduce-scatter to owners
  bool tied_embeddings = false;       // sum embed.weight over the mesh's embedding group
  bool complete_in_backward = false;  // optimizer-in-backward: on_final during backward
  // The DP all-reduce through shared memory (parallel/shared_reduction.h) when the DP ranks
  // share memory, hierarchically across hosts; otherwise, and under ZeRO-1, MPI.
  bool shared_memory = true;
  // The type the buckets travel and are summed in over MPI: bfloat16 halves the bytes
  // (Megatron-LM's grad_reduce_in_fp32=false; ReduceOp::SumNarrow rounds each partial sum, as
  // NCCL's bf16 sum does), and the sum returns to the float32 gradients. The shared-memory sum
  // stays float32 (no wire).
  // Unset: the gradients' own type.
  std::optional<torch::ScalarType> reduce_dtype;
  // Parameters whose gradient reaches the optimizer another way (HeadRowStepper): no bucket;
  // their grad-ready event during the last backward, and finish(), call on_streamed_ready.
  std::vector<size_t> streamed;
  // Where the shared-memory sum offers each bucket's memory for its parameters' gradients to
  // be formed in (the run's, layers/run_context.h); null: nothing is offered, the gradients are
  // copied in.
  layers::GradDestinations* gradient_offers = nullptr;
};

class GradientSync {
 public:
  GradientSync(layers::ParameterStore& store, parallel::Mesh& mesh,
               const layers::TensorParallel& tp, const GradSyncOptions& options);
  ~GradientSync();

  // The next backward is the step's last: finish buckets as their gradients become final.
  // While armed, the layers' backward functions also drive the launched buckets' communication
  // between their products (parallel/background_progress.h).
  void arm();
  // Finishes every bucket not finished yet and waits for all communication; withdraws the
  // offers nothing took.
  void finish();
  // With the shared-memory DP sum: offers each parameter's place in this rank's region as the
  // memory its gradient is formed in (once the gradients are cleared, before the step's
  // first backward). Nothing otherwise.
  void offer_gradient_memory();
  // Whether this rank holds the final gradient of (and steps) parameter i.
  bool owns(size_t param) const { return !zero_ || zero_->owns(param); }
  // Under ZeRO-1: the partition, after the optimizer step its owners' parameters go back to
  // every rank with zero()->all_gather_parameters(store); null otherwise.
  ZeroPartition* zero() { return zero_.get(); }
  // The group over which final gradients are sharded (ZeRO's DP group), else null.
  parallel::Communicator* sharded_over() { return zero_ ? &mesh_.gradient_reduction() : nullptr; }
  void set_on_final(std::function<void(size_t param)> on_final) { on_final_ = std::move(on_final); }
  void set_on_streamed_ready(std::function<void(size_t param)> ready) {
    on_streamed_ready_ = std::move(ready);
  }
  // Called at every grad-ready event of the last backward: drives communication launched
  // elsewhere (a reduce-only HeadRowStepper's blocks) while backward runs.
  void set_on_progress(std::function<void()> progress) { on_progress_ = std::move(progress); }

  size_t bucket_count() const { return buckets_.size(); }
  // Whether the DP all-reduce goes through shared memory (else MPI).
  bool reduces_in_shared_memory() const { return shared_ != nullptr; }
  // How the DP sum runs, for logs: the shared-memory sum's description, or the MPI
  // operation (all-reduce, or ZeRO-1's reduce-scatter).
  std::string describe_dp_sum() const;
  // Bytes of this rank's shared-memory segment (0 without one).
  int64_t shared_bytes() const { return shared_ ? shared_->segment_bytes() : 0; }
  // Gradient bytes copied into that segment so far (the rest were formed in it).
  int64_t shared_bytes_copied_in() const { return shared_ ? shared_->bytes_copied_in() : 0; }
  // Buckets launched from a hook during the last step's backward.
  int64_t finished_during_backward() const { return finished_early_; }
  // Buckets completed (on_final called) during the last step's backward.
  int64_t completed_during_backward() const { return completed_early_; }

 private:
  struct Bucket {
    std::vector<size_t> params;         // store indices; under ZeRO in owner order
    std::vector<int64_t> owner_counts;  // ZeRO: elements per DP rank
    bool deferred = false;              // only finish() may complete it (the tied embedding)
    int ready = 0;
    bool launched = false;
    bool completed = false;  // during backward; finish() skips it
    torch::Tensor flat;      // the DP message (kept until the operation completes)
    torch::Tensor result;    // its reduced form: flat itself, or under ZeRO this rank's part
    parallel::Handle handle;
  };
  void on_grad_ready(size_t param);
  // Lets launched communication move on without waiting (the shared-memory sum, MPI, the head
  // stepper's blocks).
  void progress_launched();
  // Steps 1 and 2, then launches step 3 of the ordering rule.
  void launch(Bucket& bucket);
  // Waits for step 3 and writes the results back over .grad().
  void complete(Bucket& bucket);
  // Whether step 3 of a launched bucket is done (complete would not wait).
  bool reduced(Bucket& bucket);
  int index_of(const Bucket& bucket) const;
  void withdraw_gradient_memory();

  layers::ParameterStore& store_;
  parallel::Mesh& mesh_;
  layers::TensorParallel tp_;
  GradSyncOptions options_;
  std::unique_ptr<ZeroPartition> zero_;
  std::unique_ptr<parallel::SharedReduction> shared_;  // null: the DP reduction goes by MPI
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  bool armed_ = false;
  int64_t finished_early_ = 0, completed_early_ = 0;
  std::function<void(size_t)> on_final_, on_streamed_ready_;
  std::function<void()> on_progress_;
  std::unique_ptr<GradReadyHooks> hooks_;
};

}  // namespace retort::engine
