// engine/hf/safetensors.cpp: see safetensors.h.
#include "engine/hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/user_error.h"

namespace retort::hf {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // as the reference implementation

struct DtypeInfo {
  StDtype dtype;
  const char* name;
  size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {{StDtype::F64, "F64", 8}, {StDtype::F32, "F32", 4},
                                 {StDtype::F16, "F16", 2}, {StDtype::BF16, "BF16", 2},
                                 {StDtype::I64, "I64", 8}, {StDtype::I32, "I32", 4},
                                 {StDtype::I16, "I16", 2}, {StDtype::I8, "I8", 1},
                                 {StDtype::U8, "U8", 1},   {StDtype::BOOL, "BOOL", 1}};

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw UserError("safetensors file '" + source + "': " + what);
}

std::string tensor_json(const StTensor& t) {
  nlohmann::json entry;
  entry["dtype"] = dtype_name(t.dtype);
  entry["shape"] = t.shape;
  entry["data_offsets"] = {t.begin, t.end};
  return entry.dump();
}

}  // namespace

size_t dtype_bytes(StDtype dtype) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == dtype) return d.bytes;
  return 0;
}

const char* dtype_name(StDtype dtype) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

std::optional<StDtype> parse_dtype(const std::string& name) {
  for (const DtypeInfo& d : kDtypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StHeader parse_safetensors_header(std::string_view text, uint64_t data_bytes,
                                  const std::string& source) {
  if (text.empty() || text.front() != '{') bad(source, "the header does not start with '{'");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(source, std::string("malformed header JSON: ") + e.what());
  }
  if (!json.is_object()) bad(source, "the header is not a JSON object");
  StHeader header;
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(source, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          bad(source, "__metadata__ value '" + m.key() + "' is not a string");
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto fail = [&](const std::string& what) { bad(source, "tensor '" + name + "': " + what); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      fail("needs dtype, shape and data_offsets");
    StTensor t;
    t.name = name;
    if (!v["dtype"].is_string()) fail("dtype is not a string");
    const auto dtype = parse_dtype(v["dtype"].get<std::string>());
    if (!dtype) fail("unknown dtype '" + v["dtype"].get<std::string>() + "'");
    t.dtype = *dtype;
    if (!v["shape"].is_array()) fail("shape is not an array");
    uint64_t bytes = dtype_bytes(t.dtype);
    for (const nlohmann::json& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail("shape has an entry that is not a non-negative integer");
      const uint64_t size = d.get<uint64_t>();
      if (size != 0 && bytes > std::numeric_limits<uint64_t>::max() / size) fail("shape overflows");
      bytes *= size;
      t.shape.push_back(int64_t(size));
    }
    const nlohmann::json& offsets = v["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail("data_offsets is not two non-negative integers");
    t.begin = offsets[0].get<uint64_t>();
    t.end = offsets[1].get<uint64_t>();
    if (t.begin > t.end) fail("data_offsets run backwards");
    if (t.end > data_bytes)
      fail("data_offsets end " + std::to_string(t.end) + " beyond the data section of " +
           std::to_string(data_bytes) + " bytes (file truncated?)");
    if (t.end - t.begin != bytes)
      fail("data_offsets cover " + std::to_string(t.end - t.begin) +
           " bytes, its dtype and shape " + std::to_string(bytes));
    header.tensors.push_back(std::move(t));
  }
  // The ranges tile the data section: sorted by offset, each starts where the last ended.
  std::vector<const StTensor*> order;
  for (const StTensor& t : header.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const StTensor* a, const StTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  for (const StTensor* t : order) {
    if (t->begin < at) bad(source, "tensor '" + t->name + "' overlaps the tensor before it");
    if (t->begin > at)
      bad(source,
          "a hole of " + std::to_string(t->begin - at) + " bytes before tensor '" + t->name + "'");
    at = t->end;
  }
  if (at != data_bytes)
    bad(source, std::to_string(data_bytes - at) + " bytes after the last tensor belong to none");
  return header;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError("cannot open safetensors file '" + path + "'");
  struct stat st {};
  ::fstat(fd, &st);
  map_size_ = size_t(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    bad(path, "only " + std::to_string(map_size_) + " bytes, shorter than the header length");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw UserError("cannot map safetensors file '" + path + "'");
  }
  const auto* base = static_cast<const uint8_t*>(map_);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | base[i];  // little-endian
  if (header_bytes > kMaxHeader)
    bad(path, "header length " + std::to_string(header_bytes) + " above the 100 MB limit");
  if (header_bytes > map_size_ - 8)
    bad(path, "header length " + std::to_string(header_bytes) + " beyond the file's " +
                  std::to_string(map_size_) + " bytes");
  data_ = base + 8 + header_bytes;
  header_ = parse_safetensors_header(
      std::string_view(reinterpret_cast<const char*>(base + 8), header_bytes),
      map_size_ - 8 - header_bytes, path);
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

namespace {

// The header text for entries laid out in order, padded with spaces to a multiple of 8 so the
// data section starts aligned.
std::string layout_header(const std::vector<SafetensorsWriter::Entry>& entries,
                          const std::map<std::string, std::string>& metadata,
                          std::vector<StTensor>* layout) {
  std::string text = "{";
  if (!metadata.empty()) text += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  uint64_t at = 0;
  for (const auto& e : entries) {
    StTensor t;
    t.name = e.name;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.begin = at;
    t.end = at + uint64_t(t.numel()) * dtype_bytes(e.dtype);
    at = t.end;
    if (text.size() > 1) text += ",";
    text += nlohmann::json(e.name).dump() + ":" + tensor_json(t);
    if (layout) layout->push_back(std::move(t));
  }
  text += "}";
  while ((8 + text.size()) % 8 != 0) text += ' ';
  return text;
}

}  // namespace

uint64_t SafetensorsWriter::file_bytes(const std::vector<Entry>& entries) {
  uint64_t data = 0;
  for (const auto& e : entries) {
    uint64_t n = dtype_bytes(e.dtype);
    for (int64_t d : e.shape) n *= uint64_t(d);
    data += n;
  }
  return 8 + layout_header(entries, {}, nullptr).size() + data;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<Entry>& entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  const std::string text = layout_header(entries, metadata, &layout_);
  file_ = std::fopen((path + ".partial").c_str(), "wb");
  if (!file_) throw UserError("cannot create '" + path + ".partial'");
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  FILE* f = static_cast<FILE*>(file_);
  if (std::fwrite(length, 1, 8, f) != 8 ||
      std::fwrite(text.data(), 1, text.size(), f) != text.size())
    throw UserError("cannot write '" + path + ".partial'");
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) {  // not finished: nothing half-written is left under the final name
    std::fclose(static_cast<FILE*>(file_));
    std::remove((path_ + ".partial").c_str());
  }
}

void SafetensorsWriter::write(const std::string& name, const void* bytes, size_t size) {
  if (next_ >= layout_.size() || layout_[next_].name != name)
    throw UserError("safetensors writer for '" + path_ + "': tensor '" + name +
                    "' is not the next one declared");
  const StTensor& t = layout_[next_];
  if (size != t.end - t.begin)
    throw UserError("safetensors writer for '" + path_ + "': tensor '" + name + "' has " +
                    std::to_string(size) + " bytes, declared " + std::to_string(t.end - t.begin));
  if (std::fwrite(bytes, 1, size, static_cast<FILE*>(file_)) != size)
    throw UserError("cannot write '" + path_ + ".partial' (disk full?)");
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != layout_.size())
    throw UserError("safetensors writer for '" + path_ + "': " +
                    std::to_string(layout_.size() - next_) + " declared tensors never written");
  FILE* f = static_cast<FILE*>(file_);
  file_ = nullptr;
  const bool flushed = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  std::fclose(f);
  if (!flushed) throw UserError("cannot write '" + path_ + ".partial' (disk full?)");
  std::filesystem::rename(path_ + ".partial", path_);
}

}  // namespace retort::hf
