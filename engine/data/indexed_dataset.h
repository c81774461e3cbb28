// engine/data/indexed_dataset.h: Megatron's indexed dataset, the .bin (tokens) + .idx (index)
// pair, MMIDIDX version 1, every dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
// 6 float64, 7 float32, 8 uint16). The reader maps both files and checks the index against
// the file sizes, so a corrupt or truncated file is a clear error, never a crash.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace retort::engine {

enum class TokenDtype : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8
};
size_t dtype_size(TokenDtype dtype);

class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);  // reads prefix.idx and prefix.bin
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  int64_t sequence_count() const { return sequence_count_; }
  int64_t document_count() const { return int64_t(document_indices_.size()) - 1; }
  int64_t sequence_length(int64_t i) const;
  const std::vector<int64_t>& document_indices() const { return document_indices_; }
  TokenDtype dtype() const { return dtype_; }
  const std::string& prefix() const { return prefix_; }
  int64_t total_tokens() const;

  // Copies `count` tokens of sequence `seq` starting at `offset` into out, as int64.
  void read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const;

  // The smallest and largest token id of every sequence, by one pass over the .bin.
  struct TokenRange {
    int64_t smallest = 0, largest = -1;  // largest < smallest: no tokens
  };
  TokenRange token_range() const;

 private:
  std::string prefix_;
  TokenDtype dtype_ = TokenDtype::UInt16;
  int64_t sequence_count_ = 0;
  // The index's length and pointer arrays, in place in the mapping. Megatron's 34-byte
  // header leaves them unaligned, so elements are read with memcpy.
  const uint8_t* lengths_ = nullptr;   // int32 per sequence
  const uint8_t* pointers_ = nullptr;  // int64 per sequence: byte offset in the .bin
  int64_t pointer(int64_t i) const;
  std::vector<int64_t> document_indices_;
  const uint8_t* bin_ = nullptr;
  size_t bin_size_ = 0;
  void* idx_map_ = nullptr;
  size_t idx_size_ = 0;
};

// Writes prefix.bin and prefix.idx, one sequence per document.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype);
  void add_document(const std::vector<int64_t>& tokens);
  void finish();

 private:
  std::string prefix_;
  TokenDtype dtype_;
  std::vector<uint8_t> bin_;
  std::vector<int32_t> lengths_;
};

}  // namespace retort::engine
