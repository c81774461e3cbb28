// engine/optim/grad_sync.cpp: see grad_sync.h.
#include "engine/optim/grad_sync.h"

#include <algorithm>

#include "common/fault_injection.h"
#include "engine/optim/flat_copy.h"
#include "layers/grad_destinations.h"
#include "parallel/background_progress.h"

namespace retort::engine {
namespace {

const char* const kTiedName = "embed.weight";

torch::Tensor grad_or_zeros(layers::Parameter& p) {
  if (!p.value.grad().defined()) p.value.mutable_grad() = torch::zeros_like(p.value);
  return p.value.grad();
}

std::vector<torch::Tensor> grads_of(const std::vector<layers::Parameter*>& params) {
  std::vector<torch::Tensor> grads;
  for (layers::Parameter* p : params) grads.push_back(grad_or_zeros(*p));
  return grads;
}

}  // namespace

void sum_partial_tp_grads(const std::vector<layers::Parameter*>& params,
                          const layers::TensorParallel& tp) {
  if (tp.size() == 1 || params.empty()) return;
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> grads = grads_of(params);
  torch::Tensor flat = flatten(grads);
  tp.group->all_reduce(flat);
  copy_back(flat, grads);
}

void sum_partial_tp_grads(layers::ParameterStore& store, const layers::TensorParallel& tp) {
  std::vector<layers::Parameter*> params;
  for (auto& p : store.all())
    if (!p.spec.frozen() && p.spec.needs_tp_grad_sum(tp.sequence_parallel)) params.push_back(&p);
  sum_partial_tp_grads(params, tp);
}

GradientSync::GradientSync(layers::ParameterStore& store, parallel::Mesh& mesh,
                           const layers::TensorParallel& tp, const GradSyncOptions& options)
    : store_(store), mesh_(mesh), tp_(tp), options_(options), bucket_of_(store.all().size(), -1) {
  if (options_.zero && mesh_.gradient_reduction().size() > 1)
    zero_ = std::make_unique<ZeroPartition>(store, mesh_.gradient_reduction());
  const bool tied_across_stages = options_.tied_embeddings && mesh_.embedding();
  Bucket current, tied;
  tied.deferred = true;
  int64_t bytes = 0;
  // Stepping inside backward without DP: nothing to batch, so every parameter is its own
  // bucket and steps (and frees its gradient) the moment it is final.
  const int64_t bucket_bytes =
      options_.complete_in_backward && mesh_.gradient_reduction().size() == 1 ? 0 : options_.bucket_bytes;
  for (size_t k = store.all().size(); k-- > 0;) {
    const layers::Parameter& p = store.all()[k];
    if (p.spec.frozen() || std::count(options_.streamed.begin(), options_.streamed.end(), k))
      continue;
    if (tied_across_stages && p.spec.name == kTiedName) {
      tied.params.push_back(k);
      continue;
    }
    current.params.push_back(k);
    bytes += p.value.numel() * p.value.element_size();
    // Weights that share one buffer (q|k|v, gate|up: one product forms their gradients
    // together) stay in one bucket, so their places in it are one block.
    const bool shares_with_next =
        bucket_bytes > 0 && k > 0 && store.all()[k - 1].value.is_alias_of(p.value);
    if (bytes >= bucket_bytes && !shares_with_next) {
      buckets_.push_back(std::move(current));
      current = Bucket();
      bytes = 0;
    }
  }
  if (!current.params.empty()) buckets_.push_back(std::move(current));
  if (!tied.params.empty()) buckets_.push_back(std::move(tied));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    for (size_t k : bucket.params) bucket_of_[k] = int(b);
    // Creation order inside a bucket: weights one product forms together (q|k|v, gate|up)
    // were created, and are stacked, in that order, so their places in a shared region are
    // one block that product can fill (offer_gradient_memory).
    std::sort(bucket.params.begin(), bucket.params.end());
    if (!zero_) continue;
    // Owner order, so the reduce-scatter hands each rank the contiguous part it owns.
    std::stable_sort(bucket.params.begin(), bucket.params.end(),
                     [&](size_t x, size_t y) { return zero_->owner(x) < zero_->owner(y); });
    bucket.owner_counts.assign(mesh_.gradient_reduction().size(), 0);
    for (size_t k : bucket.params)
      bucket.owner_counts[zero_->owner(k)] += store.all()[k].value.numel();
  }
  if (!zero_ && options_.shared_memory && mesh_.gradient_reduction().size() > 1) {
    // One shared-memory slot per bucket, when the DP ranks share memory (on each host).
    std::vector<parallel::SharedSlot> slots;
    bool usable = true;  // CPU tensors, one dtype per bucket
    for (const Bucket& bucket : buckets_) {
      parallel::SharedSlot slot;
      for (size_t k : bucket.params) {
        const torch::Tensor& value = store.all()[k].value;
        usable = usable && value.device().is_cpu() &&
                 (slot.elements == 0 || slot.dtype == value.scalar_type());
        slot.elements += value.numel();
        slot.dtype = value.scalar_type();
      }
      slots.push_back(slot);
    }
    if (usable) shared_ = parallel::SharedReduction::create(mesh_.gradient_reduction(), slots);
  }
  if (mesh_.gradient_reduction().size() > 1 || options_.complete_in_backward)
    hooks_ = std::make_unique<GradReadyHooks>(store, [this](size_t k) { on_grad_ready(k); });
}

GradientSync::~GradientSync() {
  if (armed_) parallel::set_background_progress(nullptr);
  withdraw_gradient_memory();  // the offers point into the region freed with shared_
}

std::string GradientSync::describe_dp_sum() const {
  if (shared_) return shared_->describe();
  return std::string(zero_ ? "MPI reduce-scatter (ZeRO-1)" : "MPI all-reduce") + " over " +
         std::to_string(mesh_.gradient_reduction().size()) + " ranks";
}

void GradientSync::offer_gradient_memory() {
  if (!shared_ || !options_.gradient_offers) return;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    torch::Tensor region = shared_->region(int(b));
    int64_t offset = 0;
    for (size_t k : buckets_[b].params) {
      const torch::Tensor& value = store_.all()[k].value;
      options_.gradient_offers->offer(value,
                                      region.narrow(0, offset, value.numel()).view(value.sizes()));
      offset += value.numel();
    }
  }
}

void GradientSync::withdraw_gradient_memory() {
  if (!shared_ || !options_.gradient_offers) return;
  for (const Bucket& bucket : buckets_)
    for (size_t k : bucket.params) options_.gradient_offers->withdraw(store_.all()[k].value);
}

void GradientSync::arm() {
  armed_ = true;
  finished_early_ = completed_early_ = 0;
  parallel::set_background_progress([this] {
    if (on_progress_) on_progress_();
    progress_launched();
  });
}

void GradientSync::progress_launched() {
  if (shared_) shared_->progress();
  for (Bucket& b : buckets_)
    if (b.launched && b.handle.pending()) b.handle.test();
}

void GradientSync::on_grad_ready(size_t param) {
  if (!armed_) return;
  if (on_progress_) on_progress_();
  if (bucket_of_[param] < 0) {
    if (on_streamed_ready_ && std::count(options_.streamed.begin(), options_.streamed.end(), param))
      on_streamed_ready_(param);
    return;
  }
  Bucket& bucket = buckets_[bucket_of_[param]];
  if (++bucket.ready == int(bucket.params.size()) && !bucket.deferred) {
    launch(bucket);
    ++finished_early_;
  }
  // Give MPI (or the shared-memory sum) a chance to progress earlier buckets while backward
  // continues.
  progress_launched();
  if (!options_.complete_in_backward) return;
  for (Bucket& b : buckets_)
    if (b.launched && !b.completed && reduced(b)) {
      complete(b);
      b.completed = true;
      ++completed_early_;
    }
}

void GradientSync::launch(Bucket& bucket) {
  torch::NoGradGuard no_grad;
  std::vector<layers::Parameter*> params;
  for (size_t k : bucket.params) params.push_back(&store_.all()[k]);
  // 1. The tied embedding: the first stage's and the last stage's copies sum.
  if (bucket.deferred && !fault_injected(Fault::TiedSumSkipped))
    mesh_.embedding()->all_reduce(grads_of(params)[0]);
  // 2. TP partial sums.
  std::vector<layers::Parameter*> partial;
  for (layers::Parameter* p : params) {
    const bool skipped = fault_injected(Fault::TpNormGradNotSummed) &&
                         p->spec.name.find("norm") != std::string::npos;
    if (!skipped && p->spec.needs_tp_grad_sum(tp_.sequence_parallel)) partial.push_back(p);
  }
  sum_partial_tp_grads(partial, tp_);
  // 3. The DP reduction, non-blocking.
  if (shared_) {
    shared_->start(index_of(bucket), grads_of(params));
  } else if (mesh_.gradient_reduction().size() > 1) {
    bucket.flat = flatten(grads_of(params));
    if (options_.reduce_dtype) bucket.flat = bucket.flat.to(*options_.reduce_dtype);
    // In that type on the wire too (summed in it, as NCCL's bf16 sums are); float32 otherwise.
    const parallel::ReduceOp narrow =
        options_.reduce_dtype ? parallel::ReduceOp::SumNarrow : parallel::ReduceOp::Sum;
    if (zero_) {
      torch::Tensor mine =
          torch::empty({bucket.owner_counts[mesh_.gradient_reduction().rank()]}, bucket.flat.options());
      bucket.handle =
          mesh_.gradient_reduction().reduce_scatter_v_async(bucket.flat, mine, bucket.owner_counts, narrow);
      bucket.result = mine;
    } else {
      bucket.handle = mesh_.gradient_reduction().all_reduce_async(bucket.flat, narrow);
      bucket.result = bucket.flat;
    }
  }
  bucket.launched = true;
}

int GradientSync::index_of(const Bucket& bucket) const {
  return int(&bucket - buckets_.data());
}

bool GradientSync::reduced(Bucket& bucket) {
  return shared_ ? shared_->ready(index_of(bucket)) : !bucket.handle.pending();
}

void GradientSync::complete(Bucket& bucket) {
  torch::NoGradGuard no_grad;
  bucket.handle.wait();
  if (shared_) {
    // The gradients become views of the sum in this rank's shared region (no copy back):
    // valid until the bucket's next start, which comes after the next step clears them.
    const int slot = index_of(bucket);
    shared_->finish(slot);
    torch::Tensor sum = shared_->region(slot);
    int64_t offset = 0;
    for (size_t k : bucket.params) {
      torch::Tensor& value = store_.all()[k].value;
      torch::Tensor grad = sum.narrow(0, offset, value.numel()).view(value.sizes());
      offset += value.numel();
      if (fault_injected(Fault::DpGradNotAveraged)) grad.mul_(mesh_.gradient_reduction().size());
      value.mutable_grad() = grad;
    }
  } else if (mesh_.gradient_reduction().size() > 1) {
    std::vector<torch::Tensor> mine;
    for (size_t k : bucket.params) {
      layers::Parameter& p = store_.all()[k];
      if (owns(k))
        mine.push_back(p.value.grad());
      else
        p.value.mutable_grad().reset();  // ZeRO: not ours, no gradient, no state, no step
    }
    if (!mine.empty()) copy_back(bucket.result, mine);
    if (fault_injected(Fault::DpGradNotAveraged))
      for (torch::Tensor& g : mine) g.mul_(mesh_.gradient_reduction().size());
  }
  bucket.flat = bucket.result = torch::Tensor();
  bucket.ready = 0;
  bucket.launched = false;
  if (on_final_)
    for (size_t k : bucket.params)
      if (owns(k)) on_final_(k);
}

void GradientSync::finish() {
  for (Bucket& bucket : buckets_) {
    if (bucket.completed) {
      bucket.completed = false;
      continue;
    }
    if (!bucket.launched) launch(bucket);
    complete(bucket);
  }
  if (on_streamed_ready_)
    for (size_t k : options_.streamed) on_streamed_ready_(k);
  withdraw_gradient_memory();
  armed_ = false;
  parallel::set_background_progress(nullptr);
}

}  // namespace retort::engine
