// engine/data/token_windows.h: GPT-style training samples. The chosen documents of one indexed
// dataset are concatenated in a seeded, per-epoch shuffled order and cut into windows of
// seq_len + 1 tokens that run across document boundaries; the windows of an epoch are then
// visited in a seeded shuffled order (as Megatron's GPTDataset does with its doc, sample and
// shuffle indices). Sample i is a pure function of (dataset, documents, seq_len, seed, i).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/data/indexed_dataset.h"

namespace retort::engine {

class TokenWindows {
 public:
  TokenWindows(std::shared_ptr<const IndexedDataset> dataset, std::vector<int64_t> documents,
               int64_t seq_len, uint64_t seed);

  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  int64_t seq_len() const { return seq_len_; }
  // Writes seq_len + 1 tokens of sample `index` (any index >= 0; epochs repeat reshuffled).
  void sample(int64_t index, int64_t* out) const;

 private:
  struct Epoch {
    std::vector<int64_t> order;         // documents (sequence ids) in this epoch's order
    std::vector<int64_t> starts;        // token offset of each of them in the stream
    std::vector<int64_t> window_order;  // shuffled window numbers
  };
  const Epoch& epoch(int64_t e) const;

  std::shared_ptr<const IndexedDataset> dataset_;
  std::vector<int64_t> documents_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t tokens_per_epoch_ = 0;
  int64_t samples_per_epoch_ = 0;
  mutable std::mutex mutex_;
  mutable std::map<int64_t, Epoch> epochs_;
};

// Deterministic Fisher-Yates shuffle of [0, n) with a 64-bit seed (portable across
// standard libraries, unlike std::shuffle).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

// Splits the documents of a dataset: the last `valid_fraction` of them (at least one when
// the fraction is positive and there are two or more) are held out for validation.
void split_documents(int64_t document_count, double valid_fraction, std::vector<int64_t>* train,
                     std::vector<int64_t>* valid);

}  // namespace retort::engine
