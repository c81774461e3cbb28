// engine/data/data_setup.cpp: see data_setup.h.
#include "engine/data/data_setup.h"

#include "common/user_error.h"

namespace retort::engine {
namespace {

std::shared_ptr<const IndexedDataset> open_checked(const std::string& prefix,
                                                   const VocabularyLimit& vocabulary) {
  auto dataset = std::make_shared<const IndexedDataset>(prefix);
  const IndexedDataset::TokenRange range = dataset->token_range();
  if (range.largest < range.smallest) return dataset;  // no tokens
  const std::string file = "data file '" + prefix + ".bin'";
  if (range.smallest < 0)
    throw UserError(file + " holds token id " + std::to_string(range.smallest) +
                    "; ids must be >= 0");
  if (range.largest >= vocabulary.size)
    throw UserError(file + " holds token ids up to " + std::to_string(range.largest) + ", but " +
                    vocabulary.key + " is " + std::to_string(vocabulary.size) +
                    " (ids must be below it); was it tokenized for another model?");
  return dataset;
}

}  // namespace

SampleStreams build_sample_streams(const DataConfig& data, uint64_t run_seed,
                                   const VocabularyLimit& vocabulary) {
  const uint64_t seed = data_order_seed(data, run_seed);
  SampleStreams streams;
  std::vector<std::shared_ptr<TokenWindows>> train, valid;
  std::vector<double> valid_weights;
  for (size_t i = 0; i < data.paths.size(); ++i) {
    auto dataset = open_checked(data.paths[i], vocabulary);
    std::vector<int64_t> train_docs, valid_docs;
    const double fraction = data.valid_paths.empty() ? data.valid_fraction : 0.0;
    split_documents(dataset->sequence_count(), fraction, &train_docs, &valid_docs);
    for (int64_t d : train_docs) streams.train_tokens += dataset->sequence_length(d);
    const uint64_t source_seed = seed * 1000003ull + i;
    train.push_back(std::make_shared<TokenWindows>(dataset, train_docs, data.seq_len, source_seed));
    if (!valid_docs.empty()) {
      valid.push_back(std::make_shared<TokenWindows>(dataset, valid_docs, data.seq_len,
                                                     source_seed ^ 0xa5a5a5a5ull));
      valid_weights.push_back(data.weights[i]);
    }
  }
  for (size_t i = 0; i < data.valid_paths.size(); ++i) {
    auto dataset = open_checked(data.valid_paths[i], vocabulary);
    std::vector<int64_t> all_docs;
    for (int64_t d = 0; d < dataset->sequence_count(); ++d) all_docs.push_back(d);
    valid.push_back(std::make_shared<TokenWindows>(dataset, all_docs, data.seq_len, seed + i));
    valid_weights.push_back(1.0);
  }
  streams.train = std::make_unique<BlendedSamples>(train, data.weights);
  if (!valid.empty()) streams.valid = std::make_unique<BlendedSamples>(valid, valid_weights);
  return streams;
}

}  // namespace retort::engine
