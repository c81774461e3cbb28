// layers/compute_copy.cpp: see compute_copy.h.
#include "layers/compute_copy.h"

#include <map>
#include <mutex>
#include <vector>

#include "common/memory_category.h"
#include "layers/parallel_linear.h"

namespace retort::layers {
namespace {

// What a copy was cast from, one entry per weight: enough to see that any of them changed.
struct Source {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // held weakly: its address is not reused
  uint32_t version = 0;
};

struct Copy {
  std::vector<Source> sources;
  torch::Tensor value;
};

// The weights' places (address, shape, strides) and the copy's type.
using Key = std::vector<int64_t>;

Key key_of(at::TensorList weights, torch::ScalarType type) {
  Key key{int64_t(type)};
  for (const torch::Tensor& w : weights) {
    key.push_back(reinterpret_cast<int64_t>(w.data_ptr()));
    key.push_back(w.dim());
    key.insert(key.end(), w.sizes().begin(), w.sizes().end());
    key.insert(key.end(), w.strides().begin(), w.strides().end());
  }
  return key;
}

bool still_valid(const Copy& copy, at::TensorList weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    const Source& source = copy.sources[i];
    if (source.storage.expired() ||
        source.storage._unsafe_get_target() != weights[i].storage().unsafeGetStorageImpl() ||
        source.version != weights[i]._version())
      return false;
  }
  return true;
}

// Copies of weights that no longer exist.
void drop_expired(std::map<Key, Copy>& copies) {
  for (auto it = copies.begin(); it != copies.end();) {
    bool expired = false;
    for (const Source& source : it->second.sources) expired = expired || source.storage.expired();
    it = expired ? copies.erase(it) : std::next(it);
  }
}

// A new copy of the weights (stacked) in `type`, filed as compute-weight memory.
torch::Tensor cast_copy(at::TensorList weights, torch::ScalarType type) {
  torch::NoGradGuard no_grad;
  MemoryScope memory(MemoryCategory::compute_weights);
  // A new tensor, never an old one overwritten: a backward may still hold the old values.
  const torch::Tensor source = weights.size() == 1 ? weights[0] : stacked_rows(weights);
  return torch::empty(source.sizes(), source.options().dtype(type)).copy_(source);
}

}  // namespace

struct ComputeCopies::Cache {
  std::mutex mutex;
  std::map<Key, Copy> copies;
};

ComputeCopies::ComputeCopies(bool keep) : keep_(keep), cache_(std::make_unique<Cache>()) {}
ComputeCopies::~ComputeCopies() = default;

torch::Tensor ComputeCopies::cached_copy(at::TensorList weights, torch::ScalarType type) {
  if (!keep_) return cast_copy(weights, type);
  Cache& c = *cache_;
  const Key key = key_of(weights, type);
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.copies.find(key);
  if (it != c.copies.end() && still_valid(it->second, weights)) return it->second.value;
  // The stale copy goes first, so the old and new copies of a weight are not both held (a
  // backward still using the old one keeps it alive by itself).
  if (it != c.copies.end()) {
    c.copies.erase(it);
    it = c.copies.end();
  }
  Copy copy;
  for (const torch::Tensor& w : weights)
    copy.sources.push_back(
        {c10::weak_intrusive_ptr<c10::StorageImpl>(w.storage().getWeakStorageImpl()),
         w._version()});
  copy.value = cast_copy(weights, type);
  drop_expired(c.copies);
  torch::Tensor value = copy.value;
  c.copies[key] = std::move(copy);
  return value;
}

torch::Tensor ComputeCopies::weight_in(const torch::Tensor& weight, torch::ScalarType type) {
  if (weight.scalar_type() == type) return weight;
  return cached_copy({weight}, type);
}

torch::Tensor ComputeCopies::stacked_weights_in(at::TensorList weights, torch::ScalarType type) {
  if (weights.front().scalar_type() == type) return stacked_rows(weights);
  return cached_copy(weights, type);
}

int64_t ComputeCopies::bytes() const {
  std::lock_guard<std::mutex> lock(cache_->mutex);
  int64_t bytes = 0;
  for (const auto& [key, copy] : cache_->copies) bytes += copy.value.nbytes();
  return bytes;
}

void ComputeCopies::clear() {
  std::lock_guard<std::mutex> lock(cache_->mutex);
  cache_->copies.clear();
}

torch::Tensor weight_in(ComputeCopies* copies, const torch::Tensor& weight,
                        torch::ScalarType type) {
  if (weight.scalar_type() == type) return weight;
  if (copies) return copies->weight_in(weight, type);
  return cast_copy({weight}, type);
}

torch::Tensor stacked_weights_in(ComputeCopies* copies, at::TensorList weights,
                                 torch::ScalarType type) {
  if (weights.front().scalar_type() == type) return stacked_rows(weights);
  if (copies) return copies->stacked_weights_in(weights, type);
  return cast_copy(weights, type);
}

bool compute_copies_kept(const ComputeCopies* copies) {
  return copies && copies->kept();
}

}  // namespace retort::layers
