// engine/data/indexed_dataset.cpp: see indexed_dataset.h.
#include "engine/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include "common/user_error.h"

namespace retort::engine {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;

// Maps a whole file read-only; returns nullptr for an empty file.
void* map_file(const std::string& path, size_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError("cannot open data file '" + path + "': " + std::strerror(errno));
  struct stat st;
  ::fstat(fd, &st);
  *size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (*size > 0) {
    map = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      throw UserError("cannot map data file '" + path + "'");
    }
  }
  ::close(fd);
  return map;
}

// Calls f(T{}) with T the C++ type of `dtype`'s tokens.
template <typename F>
void with_token_type(TokenDtype dtype, F&& f) {
  switch (dtype) {
    case TokenDtype::UInt8:
      return f(uint8_t{});
    case TokenDtype::Int8:
      return f(int8_t{});
    case TokenDtype::Int16:
      return f(int16_t{});
    case TokenDtype::UInt16:
      return f(uint16_t{});
    case TokenDtype::Int32:
      return f(int32_t{});
    case TokenDtype::Int64:
      return f(int64_t{});
    case TokenDtype::Float32:
      return f(float{});
    case TokenDtype::Float64:
      return f(double{});
  }
}

// Calls f(i, token i as int64) for the `count` tokens of type T at src (unaligned: memcpy).
template <typename T, typename F>
void for_each_token(const uint8_t* src, int64_t count, F&& f) {
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    f(i, static_cast<int64_t>(v));
  }
}

}  // namespace

size_t dtype_size(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::UInt8:
    case TokenDtype::Int8:
      return 1;
    case TokenDtype::Int16:
    case TokenDtype::UInt16:
      return 2;
    case TokenDtype::Int32:
    case TokenDtype::Float32:
      return 4;
    case TokenDtype::Int64:
    case TokenDtype::Float64:
      return 8;
  }
  return 0;
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  idx_map_ = map_file(idx_path, &idx_size_);
  const uint8_t* idx = static_cast<const uint8_t*>(idx_map_);
  auto corrupt = [&](const std::string& why) {
    return UserError("corrupt index file '" + idx_path + "': " + why);
  };
  if (idx_size_ < kHeaderSize)
    throw corrupt("truncated header (" + std::to_string(idx_size_) + " bytes, need " +
                  std::to_string(kHeaderSize) + ")");
  if (std::memcmp(idx, kMagic, 9) != 0) throw corrupt("wrong magic (not MMIDIDX)");
  uint64_t version, sequences, documents;
  std::memcpy(&version, idx + 9, 8);
  uint8_t code = idx[17];
  std::memcpy(&sequences, idx + 18, 8);
  std::memcpy(&documents, idx + 26, 8);
  if (version != 1) throw corrupt("version " + std::to_string(version) + ", expected 1");
  if (code < 1 || code > 8) throw corrupt("unknown dtype code " + std::to_string(code));
  dtype_ = static_cast<TokenDtype>(code);
  const uint64_t need = kHeaderSize + sequences * 4 + sequences * 8 + documents * 8;
  if (sequences > (uint64_t(1) << 40) || documents > (uint64_t(1) << 40) || idx_size_ < need)
    throw corrupt("truncated: " + std::to_string(idx_size_) + " bytes but the header announces " +
                  std::to_string(sequences) + " sequences and " + std::to_string(documents) +
                  " document indices");
  sequence_count_ = static_cast<int64_t>(sequences);
  lengths_ = idx + kHeaderSize;
  pointers_ = idx + kHeaderSize + sequences * 4;
  if (documents == 0) throw corrupt("no document indices (there must be at least one, 0)");
  document_indices_.resize(documents);
  std::memcpy(document_indices_.data(), idx + kHeaderSize + sequences * 12, documents * 8);
  if (documents == 0 || document_indices_.front() != 0 ||
      document_indices_.back() != sequence_count_)
    throw corrupt("document indices must run from 0 to the sequence count");

  bin_ = static_cast<const uint8_t*>(map_file(bin_path, &bin_size_));
  const size_t item = dtype_size(dtype_);
  uint64_t end = 0;  // where the index's last sequence ends
  for (int64_t i = 0; i < sequence_count_; ++i) {
    const int64_t length = sequence_length(i), start = pointer(i);
    if (length < 0 || start < 0 || uint64_t(start) > bin_size_ ||
        uint64_t(length) * item > bin_size_ - uint64_t(start))
      throw UserError("data file '" + bin_path + "' is shorter than its index says (sequence " +
                      std::to_string(i) + " ends past byte " + std::to_string(bin_size_) + ")");
    end = std::max(end, uint64_t(start) + uint64_t(length) * item);
  }
  // The format stores the sequences back to back: bytes the index does not reach mean the two
  // files were written for different datasets (or the .bin was written to since).
  if (end != bin_size_)
    throw UserError("data file '" + bin_path + "' holds " + std::to_string(bin_size_) +
                    " bytes but its index '" + idx_path + "' accounts for " + std::to_string(end) +
                    ": the two files are not one dataset");
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  int32_t length;
  std::memcpy(&length, lengths_ + i * 4, 4);
  return length;
}

int64_t IndexedDataset::pointer(int64_t i) const {
  int64_t offset;
  std::memcpy(&offset, pointers_ + i * 8, 8);
  return offset;
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(idx_map_, idx_size_);
  if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
}

int64_t IndexedDataset::total_tokens() const {
  int64_t total = 0;
  for (int64_t i = 0; i < sequence_count_; ++i) total += sequence_length(i);
  return total;
}

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const {
  if (seq < 0 || seq >= sequence_count_ || offset < 0 || offset + count > sequence_length(seq))
    throw std::out_of_range("IndexedDataset::read outside sequence " + std::to_string(seq));
  const size_t item = dtype_size(dtype_);
  const uint8_t* src = bin_ + pointer(seq) + offset * item;
  with_token_type(dtype_, [&](auto type) {
    for_each_token<decltype(type)>(src, count, [&](int64_t i, int64_t token) { out[i] = token; });
  });
}

IndexedDataset::TokenRange IndexedDataset::token_range() const {
  TokenRange range{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  for (int64_t seq = 0; seq < sequence_count_; ++seq) {
    const uint8_t* src = bin_ + pointer(seq);
    const int64_t count = sequence_length(seq);
    with_token_type(dtype_, [&](auto type) {
      for_each_token<decltype(type)>(src, count, [&](int64_t, int64_t token) {
        range.smallest = std::min(range.smallest, token);
        range.largest = std::max(range.largest, token);
      });
    });
  }
  if (range.largest < range.smallest) return {};
  return range;
}

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype)
    : prefix_(prefix), dtype_(dtype) {}

void IndexedDatasetWriter::add_document(const std::vector<int64_t>& tokens) {
  const size_t item = dtype_size(dtype_);
  const size_t start = bin_.size();
  bin_.resize(start + tokens.size() * item);
  uint8_t* dst = bin_.data() + start;
  for (size_t i = 0; i < tokens.size(); ++i, dst += item) {
    with_token_type(dtype_, [&](auto type) {
      const decltype(type) v = static_cast<decltype(type)>(tokens[i]);
      std::memcpy(dst, &v, sizeof v);
    });
  }
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetWriter::finish() {
  const std::string bin_path = prefix_ + ".bin", idx_path = prefix_ + ".idx";
  std::ofstream bin(bin_path, std::ios::binary);
  if (!bin) throw UserError("cannot write '" + bin_path + "'");
  bin.write(reinterpret_cast<const char*>(bin_.data()), bin_.size());
  std::ofstream idx(idx_path, std::ios::binary);
  if (!idx) throw UserError("cannot write '" + idx_path + "'");
  const uint64_t version = 1, sequences = lengths_.size(), documents = lengths_.size() + 1;
  const uint8_t code = static_cast<uint8_t>(dtype_);
  idx.write(kMagic, 9);
  idx.write(reinterpret_cast<const char*>(&version), 8);
  idx.write(reinterpret_cast<const char*>(&code), 1);
  idx.write(reinterpret_cast<const char*>(&sequences), 8);
  idx.write(reinterpret_cast<const char*>(&documents), 8);
  idx.write(reinterpret_cast<const char*>(lengths_.data()), lengths_.size() * 4);
  int64_t pointer = 0;
  for (int32_t length : lengths_) {
    idx.write(reinterpret_cast<const char*>(&pointer), 8);
    pointer += int64_t(length) * dtype_size(dtype_);
  }
  for (int64_t d = 0; d <= int64_t(lengths_.size()); ++d)
    idx.write(reinterpret_cast<const char*>(&d), 8);
  if (!bin || !idx) throw UserError("failed writing dataset '" + prefix_ + "'");
}

}  // namespace retort::engine
