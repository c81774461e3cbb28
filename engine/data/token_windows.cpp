// engine/data/token_windows.cpp: see token_windows.h.
#include "engine/data/token_windows.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "common/user_error.h"

namespace retort::engine {

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

void split_documents(int64_t document_count, double valid_fraction, std::vector<int64_t>* train,
                     std::vector<int64_t>* valid) {
  int64_t n_valid = static_cast<int64_t>(std::llround(valid_fraction * document_count));
  if (valid_fraction > 0 && n_valid == 0 && document_count >= 2) n_valid = 1;
  if (n_valid >= document_count) n_valid = document_count - 1;
  train->clear();
  valid->clear();
  for (int64_t d = 0; d < document_count; ++d)
    (d < document_count - n_valid ? train : valid)->push_back(d);
}

TokenWindows::TokenWindows(std::shared_ptr<const IndexedDataset> dataset,
                           std::vector<int64_t> documents, int64_t seq_len, uint64_t seed)
    : dataset_(std::move(dataset)),
      documents_(std::move(documents)),
      seq_len_(seq_len),
      seed_(seed) {
  for (int64_t d : documents_) tokens_per_epoch_ += dataset_->sequence_length(d);
  samples_per_epoch_ = tokens_per_epoch_ > 0 ? (tokens_per_epoch_ - 1) / seq_len_ : 0;
  if (samples_per_epoch_ == 0)
    throw UserError("dataset '" + dataset_->prefix() + "' has " +
                    std::to_string(tokens_per_epoch_) + " tokens in the chosen split, fewer " +
                    "than one sample of data.seq_len+1=" + std::to_string(seq_len_ + 1));
}

const TokenWindows::Epoch& TokenWindows::epoch(int64_t e) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = epochs_.find(e);
  if (it != epochs_.end()) return it->second;
  Epoch epoch;
  const uint64_t epoch_seed = seed_ * 0x9e3779b97f4a7c15ull + uint64_t(e) * 2 + 1;
  for (int64_t k : seeded_permutation(int64_t(documents_.size()), epoch_seed))
    epoch.order.push_back(documents_[k]);
  int64_t offset = 0;
  for (int64_t d : epoch.order) {
    epoch.starts.push_back(offset);
    offset += dataset_->sequence_length(d);
  }
  epoch.window_order = seeded_permutation(samples_per_epoch_, epoch_seed ^ 0x5bd1e995ull);
  if (epochs_.size() > 4) epochs_.erase(epochs_.begin());  // keep recent epochs only
  return epochs_.emplace(e, std::move(epoch)).first->second;
}

void TokenWindows::sample(int64_t index, int64_t* out) const {
  const Epoch& ep = epoch(index / samples_per_epoch_);
  int64_t position = ep.window_order[index % samples_per_epoch_] * seq_len_;
  int64_t remaining = seq_len_ + 1;
  // The document holding `position`: the last start <= position.
  size_t doc =
      std::upper_bound(ep.starts.begin(), ep.starts.end(), position) - ep.starts.begin() - 1;
  int64_t offset = position - ep.starts[doc];
  while (remaining > 0) {
    const int64_t seq = ep.order[doc];
    const int64_t take = std::min(remaining, dataset_->sequence_length(seq) - offset);
    dataset_->read(seq, offset, take, out);
    out += take;
    remaining -= take;
    ++doc;
    offset = 0;
  }
}

}  // namespace retort::engine
