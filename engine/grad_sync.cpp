// engine/grad_sync.cpp: see grad_sync.h.
#include "engine/grad_sync.h"

#include "common/fault_injection.h"

namespace retort::engine {
namespace {

torch::Tensor grad_or_zeros(layers::Parameter& p) {
  if (!p.value.grad().defined()) p.value.mutable_grad() = torch::zeros_like(p.value);
  return p.value.grad();
}

}  // namespace

void sum_tied_grads(layers::ParameterStore& store, const std::string& name,
                    parallel::Communicator& embedding) {
  layers::Parameter* p = store.find(name);
  TORCH_CHECK(p, "sum_tied_grads: no parameter ", name, " on this stage");
  if (p->spec.frozen()) return;
  torch::Tensor grad = grad_or_zeros(*p);
  embedding.all_reduce(grad);
}

void sum_partial_tp_grads(layers::ParameterStore& store, const layers::TensorParallel& tp) {
  if (tp.size() == 1) return;
  std::vector<layers::Parameter*> params;
  for (auto& p : store.all()) {
    if (fault_injected(Fault::TpNormGradNotSummed) && p.spec.name.find("norm") != std::string::npos)
      continue;
    if (!p.spec.frozen() && p.spec.needs_tp_grad_sum(tp.sequence_parallel)) params.push_back(&p);
  }
  if (params.empty()) return;
  std::vector<torch::Tensor> flats;
  for (auto* p : params) flats.push_back(grad_or_zeros(*p).reshape({-1}));
  torch::Tensor buffer = torch::cat(flats);
  tp.group->all_reduce(buffer);
  int64_t offset = 0;
  for (auto* p : params) {
    const int64_t n = p->value.numel();
    p->value.mutable_grad().view({-1}).copy_(buffer.narrow(0, offset, n));
    offset += n;
  }
}

DataParallelGradSync::DataParallelGradSync(layers::ParameterStore& store,
                                           parallel::Communicator& dp, int64_t bucket_bytes)
    : store_(store), dp_(dp), bucket_of_(store.all().size(), -1) {
  // Backward reaches parameters roughly in reverse order of creation: fill buckets that way.
  Bucket current;
  int64_t bytes = 0;
  for (size_t k = store.all().size(); k-- > 0;) {
    const layers::Parameter& p = store.all()[k];
    if (p.spec.frozen()) continue;
    current.params.push_back(k);
    bytes += p.value.numel() * p.value.element_size();
    if (bytes >= bucket_bytes) {
      buckets_.push_back(std::move(current));
      current = Bucket();
      bytes = 0;
    }
  }
  if (!current.params.empty()) buckets_.push_back(std::move(current));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t numel = 0;
    for (size_t k : buckets_[b].params) {
      bucket_of_[k] = int(b);
      numel += store.all()[k].value.numel();
    }
    buckets_[b].buffer = torch::empty(
        {numel}, store.all()[buckets_[b].params[0]].value.options().requires_grad(false));
  }
  hooks_ = std::make_unique<GradReadyHooks>(store, [this](size_t k) { on_grad_ready(k); });
}

void DataParallelGradSync::on_grad_ready(size_t param) {
  if (!armed_) return;
  Bucket& bucket = buckets_[bucket_of_[param]];
  if (++bucket.ready == int(bucket.params.size())) {
    launch(bucket);
    ++launched_early_;
  }
  // Give MPI a chance to progress earlier buckets while backward continues.
  for (Bucket& b : buckets_)
    if (b.launched && b.handle.pending()) b.handle.test();
}

void DataParallelGradSync::launch(Bucket& bucket) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (size_t k : bucket.params) {
    torch::Tensor g = grad_or_zeros(store_.all()[k]).reshape({-1});
    bucket.buffer.narrow(0, offset, g.numel()).copy_(g);
    offset += g.numel();
  }
  bucket.handle = dp_.all_reduce_async(bucket.buffer);
  bucket.launched = true;
}

void DataParallelGradSync::finish() {
  torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    if (!bucket.launched) launch(bucket);
    bucket.handle.wait();
    int64_t offset = 0;
    for (size_t k : bucket.params) {
      torch::Tensor g = store_.all()[k].value.mutable_grad();
      g.view({-1}).copy_(bucket.buffer.narrow(0, offset, g.numel()));
      if (fault_injected(Fault::DpGradNotAveraged)) g.mul_(dp_.size());
      offset += g.numel();
    }
    bucket.ready = 0;
    bucket.launched = false;
  }
  armed_ = false;
}

}  // namespace retort::engine
