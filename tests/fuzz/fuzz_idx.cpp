// tests/fuzz/fuzz_idx.cpp: libFuzzer target for the Megatron .idx reader. The input is
// written as PREFIX.idx beside a fixed 4 kB PREFIX.bin; the dataset is opened and every
// sequence it claims is read (clamped to 64 tokens). A malformed index must end in
// UserError; anything else escaping, a crash or a sanitizer report is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/user_error.h"
#include "engine/data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = "/tmp/retort_fuzz_idx_" + std::to_string(getpid());
  static const bool bin_written = [] {
    // Removed when libFuzzer exits (it ends with exit() at -max_total_time).
    std::atexit([] {
      std::remove((prefix + ".bin").c_str());
      std::remove((prefix + ".idx").c_str());
    });
    std::ofstream bin(prefix + ".bin", std::ios::binary);
    const std::vector<char> zeros(4096, 1);
    bin.write(zeros.data(), std::streamsize(zeros.size()));
    return true;
  }();
  (void)bin_written;
  {
    std::ofstream idx(prefix + ".idx", std::ios::binary | std::ios::trunc);
    idx.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    retort::engine::IndexedDataset dataset(prefix);
    std::vector<int64_t> tokens(64);
    for (int64_t i = 0; i < dataset.sequence_count() && i < 1024; ++i) {
      const int64_t n = std::min<int64_t>(dataset.sequence_length(i), 64);
      dataset.read(i, 0, n, tokens.data());
    }
    (void)dataset.total_tokens();
  } catch (const retort::UserError&) {
  }
  return 0;
}
