// tests/unit/data_test.cpp: Megatron .bin/.idx reading and writing for every dtype code,
// refusal of missing and corrupt files, GPT-style windows across document boundaries,
// blending by weight and the DP-independent order of samples in a global batch.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "common/user_error.h"
#include "engine/data/batches.h"
#include "engine/data/blended_samples.h"
#include "engine/data/data_setup.h"
#include "engine/data/indexed_dataset.h"
#include "engine/data/token_windows.h"
#include "tests/support/scratch_dir.h"

using namespace retort;
using namespace retort::engine;
namespace fs = std::filesystem;

namespace {

std::string temp_prefix(const std::string& name) {
  static const fs::path dir = retort::testing::scratch_dir("data_test");
  return (dir / name).string();
}

// Documents of lengths 5, 1, 9, 3, 7 whose tokens count up from `base`, so any token tells
// where it came from.
std::vector<std::vector<int64_t>> sample_documents(int64_t base = 0) {
  std::vector<std::vector<int64_t>> docs;
  int64_t next = base;
  for (int64_t length : {5, 1, 9, 3, 7}) {
    std::vector<int64_t> d(length);
    std::iota(d.begin(), d.end(), next);
    next += length;
    docs.push_back(d);
  }
  return docs;
}

std::string write_dataset(const std::string& name, TokenDtype dtype,
                          const std::vector<std::vector<int64_t>>& docs) {
  const std::string prefix = temp_prefix(name);
  IndexedDatasetWriter writer(prefix, dtype);
  for (const auto& d : docs) writer.add_document(d);
  writer.finish();
  return prefix;
}

std::string error_of(const std::string& prefix) {
  try {
    IndexedDataset d(prefix);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(IndexedDataset, RoundTripsEveryDtypeCode) {
  const auto docs = sample_documents(100);
  for (int code = 1; code <= 8; ++code) {
    const auto dtype = static_cast<TokenDtype>(code);
    const std::string prefix = write_dataset("dtype" + std::to_string(code), dtype, docs);
    IndexedDataset ds(prefix);
    EXPECT_EQ(int(ds.dtype()), code);
    ASSERT_EQ(ds.sequence_count(), 5);
    EXPECT_EQ(ds.document_count(), 5);
    EXPECT_EQ(fs::file_size(prefix + ".bin"), 25 * dtype_size(dtype));
    for (int64_t s = 0; s < 5; ++s) {
      std::vector<int64_t> got(ds.sequence_length(s));
      ds.read(s, 0, int64_t(got.size()), got.data());
      EXPECT_EQ(got, docs[s]) << "code " << code << " sequence " << s;
    }
  }
}

TEST(IndexedDataset, HeaderLayoutIsMegatrons) {
  const std::string prefix = write_dataset("layout", TokenDtype::UInt16, sample_documents());
  std::ifstream in(prefix + ".idx", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 34u + 5 * 4 + 5 * 8 + 6 * 8);
  EXPECT_EQ(std::string(bytes.data(), 7), "MMIDIDX");
  EXPECT_EQ(bytes[9], 1);   // version, little-endian u64
  EXPECT_EQ(bytes[17], 8);  // dtype code of uint16
  EXPECT_EQ(bytes[18], 5);  // sequence count
  EXPECT_EQ(bytes[26], 6);  // document index count (documents + 1)
  int64_t second_pointer;
  std::memcpy(&second_pointer, bytes.data() + 34 + 20 + 8, 8);
  EXPECT_EQ(second_pointer, 5 * 2);  // byte offset of sequence 1
}

TEST(IndexedDataset, RefusesMissingAndCorruptFiles) {
  EXPECT_NE(error_of(temp_prefix("absent")).find("cannot open data file"), std::string::npos);
  const std::string prefix = write_dataset("corrupt", TokenDtype::Int32, sample_documents());
  const std::string idx = prefix + ".idx";
  std::string original;
  {
    std::ifstream in(idx, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto rewrite = [&](const std::string& content) {
    std::ofstream(idx, std::ios::binary | std::ios::trunc) << content;
  };
  std::string bad_magic = original;
  bad_magic[0] = 'X';
  rewrite(bad_magic);
  std::string e = error_of(prefix);
  EXPECT_NE(e.find("corrupt index file '" + idx + "': wrong magic"), std::string::npos) << e;

  rewrite(original.substr(0, 20));
  e = error_of(prefix);
  EXPECT_NE(e.find("truncated header"), std::string::npos) << e;

  rewrite(original.substr(0, original.size() - 9));
  e = error_of(prefix);
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  std::string bad_code = original;
  bad_code[17] = 12;
  rewrite(bad_code);
  EXPECT_NE(error_of(prefix).find("unknown dtype code 12"), std::string::npos);

  rewrite(original);
  fs::resize_file(prefix + ".bin", 40);
  EXPECT_NE(error_of(prefix).find("shorter than its index says"), std::string::npos);
}

TEST(TokenWindows, WindowsFollowTheShuffledDocumentStream) {
  const auto docs = sample_documents();  // 25 tokens, values 0..24
  auto ds = std::make_shared<IndexedDataset>(write_dataset("windows", TokenDtype::UInt16, docs));
  TokenWindows windows(ds, {0, 1, 2, 3, 4}, 4, 99);
  EXPECT_EQ(windows.samples_per_epoch(), 6);  // (25 - 1) / 4
  // Windows of one epoch start at distinct multiples of 4 in one stream, and consecutive
  // windows overlap by exactly one token: reassembling them gives the stream back.
  std::map<int64_t, std::vector<int64_t>> by_first_token;
  std::vector<std::vector<int64_t>> epoch0;
  for (int64_t i = 0; i < 6; ++i) {
    std::vector<int64_t> w(5);
    windows.sample(i, w.data());
    epoch0.push_back(w);
  }
  // Every token of the epoch-0 stream appears; the stream is a permutation of documents.
  std::set<int64_t> seen;
  for (const auto& w : epoch0) seen.insert(w.begin(), w.end());
  EXPECT_GE(seen.size(), 24u);
  // Inside a window, tokens of one document are consecutive values.
  int crossings = 0;
  for (const auto& w : epoch0)
    for (size_t k = 1; k < w.size(); ++k)
      if (w[k] != w[k - 1] + 1) ++crossings;
  EXPECT_GT(crossings, 0);  // some windows run across document boundaries
  EXPECT_LE(crossings, 4);  // at most one crossing per document boundary
  // Deterministic, and epoch 1 is a different order.
  TokenWindows again(ds, {0, 1, 2, 3, 4}, 4, 99);
  std::vector<int64_t> w(5), w1(5);
  again.sample(3, w.data());
  EXPECT_EQ(w, epoch0[3]);
  bool differs = false;
  for (int64_t i = 0; i < 6; ++i) {
    windows.sample(6 + i, w1.data());
    differs |= w1 != epoch0[i];
  }
  EXPECT_TRUE(differs);
}

TEST(TokenWindows, SplitHoldsOutLastDocuments) {
  std::vector<int64_t> train, valid;
  split_documents(27, 0.05, &train, &valid);
  EXPECT_EQ(valid, (std::vector<int64_t>{26}));
  EXPECT_EQ(train.size(), 26u);
  split_documents(10, 0.0, &train, &valid);
  EXPECT_TRUE(valid.empty());
}

TEST(BlendedSamples, FollowsWeights) {
  auto a = std::make_shared<IndexedDataset>(
      write_dataset("blend_a", TokenDtype::UInt16, sample_documents(0)));
  auto b = std::make_shared<IndexedDataset>(
      write_dataset("blend_b", TokenDtype::UInt16, sample_documents(1000)));
  BlendedSamples blend(
      {std::make_shared<TokenWindows>(a, std::vector<int64_t>{0, 1, 2, 3, 4}, 4, 1),
       std::make_shared<TokenWindows>(b, std::vector<int64_t>{0, 1, 2, 3, 4}, 4, 2)},
      {3.0, 1.0});
  int from_b = 0;
  for (int64_t i = 0; i < 400; ++i) {
    std::vector<int64_t> w(5);
    blend.sample(i, w.data());
    const bool is_b = w[0] >= 1000;
    EXPECT_EQ(is_b, blend.locate(i).first == 1);
    from_b += is_b;
  }
  EXPECT_EQ(from_b, 100);
}

// data.seed decides the order alone: runs of two seeds with one data.seed read the same
// samples (what lets students of different seeds share a teacher cache); without it, the run's
// seed decides, and two seeds read different ones.
TEST(SampleStreams, DataSeedDecidesTheOrderWhateverTheRunSeed) {
  DataConfig data;
  data.paths = {write_dataset("seeded", TokenDtype::UInt16, sample_documents(0))};
  data.weights = {1.0};
  data.seq_len = 4;
  data.valid_fraction = 0;
  const VocabularyLimit vocabulary{1000, "model.vocab_size"};
  auto first_samples = [&](uint64_t run_seed) {
    SampleStreams streams = build_sample_streams(data, run_seed, vocabulary);
    std::vector<int64_t> tokens(5 * 12);
    for (int64_t i = 0; i < 12; ++i) streams.train->sample(i, tokens.data() + 5 * i);
    return tokens;
  };
  data.seed = 7;
  EXPECT_EQ(first_samples(1), first_samples(2));
  EXPECT_EQ(data_order_seed(data, 2), 7u);
  data.seed = 0;
  EXPECT_NE(first_samples(1), first_samples(2));
  EXPECT_EQ(data_order_seed(data, 2), 2u);
}

TEST(BatchPlan, GlobalBatchOrderIndependentOfDataParallelRanks) {
  const int64_t global = 16, micro = 2;
  for (int dp : {1, 2, 4, 8}) {
    std::vector<int64_t> order;
    for (int rank = 0; rank < dp; ++rank) {
      BatchPlan plan(global, micro, dp, rank);
      EXPECT_EQ(plan.micro_batches_per_step() * micro * dp, global);
      for (int64_t m = 0; m < plan.micro_batches_per_step(); ++m)
        for (int64_t k = 0; k < micro; ++k) order.push_back(plan.first_sample(3, m) + k);
    }
    std::vector<int64_t> expected(global);
    std::iota(expected.begin(), expected.end(), 3 * global);
    EXPECT_EQ(order, expected) << "dp " << dp;
  }
}
