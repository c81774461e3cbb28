// engine/data/data_setup.h: builds the training and validation sample streams from the data
// section: opens every dataset, holds out the last documents of each for validation (or
// uses data.valid_paths), and blends the sources by weight.
#pragma once
#include <memory>

#include "engine/config/train_config.h"
#include "engine/data/blended_samples.h"

namespace retort::engine {

struct SampleStreams {
  std::unique_ptr<BlendedSamples> train;
  std::unique_ptr<BlendedSamples> valid;  // null when there is nothing to validate on
  int64_t train_tokens = 0;
};

SampleStreams build_sample_streams(const DataConfig& data, uint64_t seed);

}  // namespace retort::engine
