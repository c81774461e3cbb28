// engine/data/data_config.h: the data.* keys: datasets, blend weights, validation split and
// sequence length. No torch here.
#pragma once
#include "common/config_fields.h"

namespace retort::engine {

#define RETORT_DATA_KEYS(KEY)                                                                  \
  KEY(std::vector<std::string>, paths, "data.paths", {}, 0, 0, "dataset prefixes (.bin/.idx)") \
  KEY(std::vector<double>, weights, "data.weights", {}, 0, kUnbounded,                         \
      "blend weights, one per path")                                                           \
  KEY(std::vector<std::string>, valid_paths, "data.valid_paths", {}, 0, 0,                     \
      "validation dataset prefixes; empty = hold out data.valid_fraction of each dataset")     \
  KEY(double, valid_fraction, "data.valid_fraction", 0.05, 0, 0.9,                             \
      "held-out fraction of documents")                                                        \
  KEY(int64_t, seq_len, "data.seq_len", 32, 1, 1e7, "tokens per sample")                       \
  KEY(int64_t, seed, "data.seed", 0, 0, 9.2e18,                                                \
      "seed of the data order (document and window shuffles); 0 = the run's seed. Students "   \
      "of different seeds with one data.seed read the same samples (a teacher cache's)")       \
  KEY(std::string, tokenizer, "data.tokenizer", "", 0, 0,                                      \
      "the tokenizer the data was made with (tokenizer.json, its folder, a SentencePiece "     \
      ".model, or bytes): recorded in checkpoints and compared with a teacher's; empty = "     \
      "not given")

struct DataConfig {
  RETORT_DATA_KEYS(RETORT_FIELD)
};

// The seed the data order follows: data.seed, else the run's.
inline uint64_t data_order_seed(const DataConfig& data, uint64_t run_seed) {
  return data.seed != 0 ? uint64_t(data.seed) : run_seed;
}

}  // namespace retort::engine
