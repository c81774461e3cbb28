// engine/data/blended_samples.h: several TokenWindows sources blended by weight, as Megatron's
// BlendedDataset: global sample i goes to the source whose realised share lags its weight
// most, so any prefix of the stream follows the weights as closely as it can.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/data/token_windows.h"

namespace retort::engine {

class BlendedSamples {
 public:
  BlendedSamples(std::vector<std::shared_ptr<TokenWindows>> sources, std::vector<double> weights);
  int64_t seq_len() const { return sources_.front()->seq_len(); }
  // Writes seq_len + 1 tokens of global sample `index`.
  void sample(int64_t index, int64_t* out);
  // Which source and which of its samples global sample `index` is.
  std::pair<int, int64_t> locate(int64_t index);

 private:
  std::vector<std::shared_ptr<TokenWindows>> sources_;
  std::vector<double> weights_;  // normalised
  std::vector<int> source_of_;   // assignment of global samples, extended on demand
  std::vector<int64_t> index_in_source_;
  std::vector<int64_t> taken_;
};

}  // namespace retort::engine
