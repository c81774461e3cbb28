// bench/bench_setup.h: what the benchmarks share to drive the real Trainer on one process:
// a dataset of random tokens over the whole vocabulary (so the LM head and the losses see
// every id, as with a real tokenizer) and a TrainConfig built from key=value assignments.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/train_config.h"

namespace retort::bench {

// Writes <dir>/random.{bin,idx}: `documents` documents of `length` uniform random tokens in
// [0, vocab); returns the prefix.
std::string write_random_dataset(const std::string& dir, int64_t vocab, int64_t documents,
                                 int64_t length, uint64_t seed);

// The run both benchmarks measure, in `dir`: `steps` + 1 steps (one to warm up) of one
// micro-batch of 4 x 256 tokens of a random-token dataset over vocabulary 32000 with tied
// embeddings; no evaluation, no checkpoint, no GEMM measurement at start.
std::vector<std::string> measured_run_keys(const std::string& dir, int steps);

// The defaults, then `assignments` in order (dotted key=value, as on the command line),
// checked like any run's config, for one process.
engine::TrainConfig bench_config(const std::vector<std::string>& assignments);

// The median of `values` (the mean of the middle two when their number is even).
double median(std::vector<double> values);

// Runs a benchmark's main; bad input (a config error) ends with "error: ..." and exit 2.
int main_reporting_errors(int (*measure)(int, char**), int argc, char** argv);

}  // namespace retort::bench
