// engine/hf/safetensors.h: the safetensors format, ours: an 8-byte little-endian header length,
// a JSON header naming each tensor's dtype, shape and byte range [begin, end) in the data
// section that follows, and an optional "__metadata__" object of strings. The reader maps the
// file read-only and checks everything before any byte of data is used: the header length
// against the file (and a 100 MB cap), the JSON, each dtype, shape and range (size = elements
// x dtype bytes, overflow-checked), and that the ranges tile the data section exactly
// (sorted, no overlap, no hole, ending at the end of the file). Errors name the file and
// tensor. The writer streams: it takes every tensor's name, dtype and shape first, writes the
// header, then takes each tensor's bytes in order, into `path.partial` renamed on finish.
// No torch here (engine/hf/hf_weights.h converts to tensors).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace retort::hf {

enum class StDtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

size_t dtype_bytes(StDtype dtype);
const char* dtype_name(StDtype dtype);
std::optional<StDtype> parse_dtype(const std::string& name);

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
  int64_t numel() const;
};

struct StHeader {
  std::vector<StTensor> tensors;  // in header (file) order
  std::map<std::string, std::string> metadata;
};

// Parses and checks a header: `json` is the header text, `data_bytes` the size of the data
// section after it; `source` names the file in errors (UserError).
StHeader parse_safetensors_header(std::string_view json, uint64_t data_bytes,
                                  const std::string& source);

// A safetensors file mapped read-only; tensors' bytes are views of the mapping.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const StHeader& header() const { return header_; }
  const StTensor* find(const std::string& name) const;
  // The tensor's bytes (little-endian, possibly unaligned for its dtype).
  const uint8_t* bytes(const StTensor& tensor) const { return data_ + tensor.begin; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  StHeader header_;
  std::map<std::string, size_t> index_;
};

// Writes a safetensors file tensor by tensor, in the order declared.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    StDtype dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, const std::vector<Entry>& entries,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // The next declared tensor's bytes (its exact size).
  void write(const std::string& name, const void* bytes, size_t size);
  // After every tensor: closes and renames the file into place.
  void finish();
  // The size a file of these entries has (header included).
  static uint64_t file_bytes(const std::vector<Entry>& entries);

 private:
  std::string path_;
  std::vector<StTensor> layout_;
  size_t next_ = 0;
  void* file_ = nullptr;  // FILE*
};

}  // namespace retort::hf
