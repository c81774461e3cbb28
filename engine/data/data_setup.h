// engine/data/data_setup.h: builds the training and validation sample streams from the data
// section: opens every dataset, holds out the last documents of each for validation (or
// uses data.valid_paths), and blends the sources by weight.
#pragma once
#include <memory>
#include <string>

#include "engine/config/train_config.h"
#include "engine/data/blended_samples.h"

namespace retort::engine {

struct SampleStreams {
  std::unique_ptr<BlendedSamples> train;
  std::unique_ptr<BlendedSamples> valid;  // null when there is nothing to validate on
  int64_t train_tokens = 0;
};

// The ids a model can take: below `size`, named by `key` in errors (model.vocab_size, or the
// teacher's vocabulary when that is smaller).
struct VocabularyLimit {
  int64_t size = 0;
  std::string key;
};

// Every dataset (data.paths and data.valid_paths) is checked against `vocabulary` first: a
// token id outside [0, vocabulary.size) stops with one line naming the file, the id and the key.
// The order follows data_order_seed(data, run_seed).
SampleStreams build_sample_streams(const DataConfig& data, uint64_t run_seed,
                                   const VocabularyLimit& vocabulary);

}  // namespace retort::engine
