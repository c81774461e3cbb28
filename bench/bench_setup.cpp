// bench/bench_setup.cpp: see bench_setup.h.
#include "bench_setup.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/config/config.h"
#include "engine/data/indexed_dataset.h"

namespace retort::bench {

std::string write_random_dataset(const std::string& dir, int64_t vocab, int64_t documents,
                                 int64_t length, uint64_t seed) {
  std::filesystem::create_directories(dir);
  const std::string prefix = (std::filesystem::path(dir) / "random").string();
  engine::IndexedDatasetWriter writer(
      prefix, vocab <= 65535 ? engine::TokenDtype::UInt16 : engine::TokenDtype::Int32);
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<int64_t> document(length);
  for (int64_t d = 0; d < documents; ++d) {
    for (int64_t& t : document) t = token(generator);
    writer.add_document(document);
  }
  writer.finish();
  return prefix;
}

std::vector<std::string> measured_run_keys(const std::string& dir, int steps) {
  const std::string data = write_random_dataset(dir, 32000, 64, 2048, 1);
  return {"model.vocab_size=32000",
          "model.tied_embeddings=true",
          "data.paths=[" + data + "]",
          "data.seq_len=256",
          "training.micro_batch=4",
          "training.global_batch=4",
          "training.steps=" + std::to_string(steps + 1),
          "training.eval_every=0",
          "checkpoint.save_at_end=false",
          "runtime.peak_gflops=1",
          "optimizer.lr=1e-4",
          "optimizer.min_lr=1e-5",
          "run.dir=" + dir};
}

engine::TrainConfig bench_config(const std::vector<std::string>& assignments) {
  return engine::make_train_config(engine::Config::load("", assignments), 1);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

int main_reporting_errors(int (*measure)(int, char**), int argc, char** argv) {
  setup_process(argv);
  try {
    return measure(argc, argv);
  } catch (const UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

}  // namespace retort::bench
