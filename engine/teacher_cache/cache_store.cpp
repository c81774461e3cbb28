// engine/teacher_cache/cache_store.cpp: see cache_store.h.
#include "engine/teacher_cache/cache_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "common/make_directories.h"
#include "common/user_error.h"
#include "engine/teacher_cache/half_float.h"
#include "kernels/crc32c.h"

namespace fs = std::filesystem;

namespace retort::engine {
namespace {

constexpr const char* kFormat = "retort-teacher-cache";
constexpr int64_t kVersion = 1;
constexpr const char* kHeaderFile = "cache.json";
constexpr char kShardMagic[8] = {'R', 'T', 'C', 'S', 'H', 'A', 'R', 'D'};
// Shard header: magic, version (u32), zero (u32), first sample, count, record bytes (i64 each),
// then its CRC-32C (u32).
constexpr int64_t kShardHeaderBytes = 40;

struct ShardHeader {
  int64_t first = 0, count = 0, record = 0;
};

std::vector<uint8_t> shard_header_bytes(const ShardHeader& h) {
  std::vector<uint8_t> bytes(kShardHeaderBytes + 4, 0);
  std::memcpy(bytes.data(), kShardMagic, 8);
  const uint32_t version = uint32_t(kVersion);
  std::memcpy(bytes.data() + 8, &version, 4);
  std::memcpy(bytes.data() + 16, &h.first, 8);
  std::memcpy(bytes.data() + 24, &h.count, 8);
  std::memcpy(bytes.data() + 32, &h.record, 8);
  const uint32_t crc = crc32c(bytes.data(), kShardHeaderBytes);
  std::memcpy(bytes.data() + kShardHeaderBytes, &crc, 4);
  return bytes;
}

nlohmann::json header_json(const TeacherCacheHeader& h) {
  const TeacherCacheShape& s = h.shape;
  return {{"format", kFormat},
          {"version", kVersion},
          {"seq_len", s.seq_len},
          {"top_k", s.top_k},
          {"vocab_size", s.vocab_size},
          {"samples", s.samples},
          {"samples_per_shard", s.samples_per_shard},
          {"id_bits", id_bits(s.vocab_size)},
          {"value_type", value_type_name(s.value_type)},
          {"fingerprint", h.fingerprint}};
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("teacher cache: cannot read '" + path.string() + "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TeacherCacheHeader read_header(const std::string& dir) {
  const fs::path path = fs::path(dir) / kHeaderFile;
  if (!fs::exists(path))
    throw UserError("teacher cache '" + dir + "': no " + kHeaderFile + " (not a teacher cache)");
  const nlohmann::json j = nlohmann::json::parse(read_text(path), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat)
    throw UserError("teacher cache: '" + path.string() + "' is not a Retort teacher cache header");
  if (j.value("version", int64_t(0)) != kVersion)
    throw UserError("teacher cache: '" + path.string() + "' has version " +
                    std::to_string(j.value("version", int64_t(0))) + "; this build reads " +
                    std::to_string(kVersion));
  TeacherCacheHeader h;
  try {
    h.shape.seq_len = j.at("seq_len").get<int64_t>();
    h.shape.top_k = j.at("top_k").get<int64_t>();
    h.shape.vocab_size = j.at("vocab_size").get<int64_t>();
    h.shape.samples = j.at("samples").get<int64_t>();
    h.shape.samples_per_shard = j.at("samples_per_shard").get<int64_t>();
    h.shape.value_type =
        parse_value_type(j.at("value_type").get<std::string>(), "'" + path.string() + "'");
    h.fingerprint = j.at("fingerprint").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw UserError("teacher cache: '" + path.string() + "': " + e.what());
  }
  const TeacherCacheShape& s = h.shape;
  if (s.seq_len <= 0 || s.top_k <= 0 || s.top_k > s.vocab_size || s.samples <= 0 ||
      s.samples_per_shard <= 0)
    throw UserError("teacher cache: '" + path.string() + "' holds an impossible shape");
  return h;
}

// The first field in which two headers differ, "" if none.
std::string first_difference(const TeacherCacheHeader& a, const TeacherCacheHeader& b) {
  const nlohmann::json ja = header_json(a), jb = header_json(b);
  for (const auto& [key, value] : ja.items()) {
    if (key == "fingerprint") continue;
    if (jb[key] != value)
      return key + " (" + value.dump() + " in the cache, " + jb[key].dump() + " asked)";
  }
  for (const auto& [key, value] : a.fingerprint) {
    auto other = b.fingerprint.find(key);
    if (other == b.fingerprint.end()) return "fingerprint." + key + " (not asked)";
    if (other->second != value)
      return "fingerprint." + key + " ('" + value + "' in the cache, '" + other->second +
             "' asked)";
  }
  for (const auto& [key, value] : b.fingerprint)
    if (!a.fingerprint.count(key)) return "fingerprint." + key + " (not in the cache)";
  return "";
}

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw UserError("teacher cache: cannot write '" + path + "'" +
                      why_writes_fail(fs::path(path).parent_path().string()));
    p += n;
    size -= size_t(n);
  }
}

// Writes `bytes` to path.partial, fsyncs it, renames it to `path`.
void write_through_partial(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string partial = path + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    throw UserError("teacher cache: cannot create '" + partial + "'" +
                    why_writes_fail(fs::path(path).parent_path().string()));
  write_all(fd, bytes.data(), bytes.size(), partial);
  ::fsync(fd);
  ::close(fd);
  if (std::rename(partial.c_str(), path.c_str()) != 0)
    throw UserError("teacher cache: cannot rename '" + partial + "' to '" + path + "'" +
                    why_writes_fail(fs::path(path).parent_path().string()));
}

// The file of the shard whose first sample is `first`.
std::string shard_name(int64_t first) {
  char name[32];
  std::snprintf(name, sizeof name, "shard_%010lld.bin", static_cast<long long>(first));
  return name;
}

int64_t value_bytes(CacheValueType type) {
  return type == CacheValueType::float64 ? 8 : 2;
}

}  // namespace

const char* value_type_name(CacheValueType type) {
  return type == CacheValueType::float64 ? "float64" : "float16";
}

CacheValueType parse_value_type(const std::string& name, const std::string& what) {
  for (CacheValueType type : {CacheValueType::float16, CacheValueType::float64})
    if (name == value_type_name(type)) return type;
  throw UserError(what + ": value type '" + name + "' is not float16 or float64");
}

int64_t id_bits(int64_t vocab_size) {
  int64_t bits = 1;
  while ((int64_t(1) << bits) < vocab_size) ++bits;
  return bits;
}

int64_t record_bytes(const TeacherCacheShape& s) {
  const int64_t entries = s.seq_len * s.top_k;
  return value_bytes(s.value_type) * (entries + s.seq_len) +
         (entries * id_bits(s.vocab_size) + 7) / 8;
}

std::vector<uint8_t> encode_record(const TeacherCacheShape& s, const CachedSample& sample) {
  const int64_t entries = s.seq_len * s.top_k;
  if (int64_t(sample.log_probs.size()) != entries || int64_t(sample.ids.size()) != entries ||
      int64_t(sample.tail_log_mass.size()) != s.seq_len)
    throw std::invalid_argument("encode_record: the sample's sizes do not match the shape");
  std::vector<uint8_t> out(size_t(record_bytes(s)), 0);
  uint8_t* at = out.data();
  auto put_value = [&](double v) {
    if (s.value_type == CacheValueType::float64) {
      std::memcpy(at, &v, 8);
      at += 8;
      return;
    }
    const uint16_t h = float_to_half(float(v));
    std::memcpy(at, &h, 2);
    at += 2;
  };
  for (double v : sample.log_probs) put_value(v);
  for (double v : sample.tail_log_mass) put_value(v);
  const int64_t bits = id_bits(s.vocab_size);
  int64_t bit = 0;
  for (int64_t id : sample.ids) {
    if (id < 0 || id >= s.vocab_size)
      throw std::invalid_argument("encode_record: id " + std::to_string(id) +
                                  " outside the vocabulary");
    for (int64_t b = 0; b < bits; ++b, ++bit)
      if ((id >> b) & 1) at[bit / 8] |= uint8_t(1u << (bit % 8));
  }
  return out;
}

CachedSample decode_record(const TeacherCacheShape& s, const uint8_t* record) {
  const int64_t entries = s.seq_len * s.top_k;
  CachedSample sample;
  sample.log_probs.resize(size_t(entries));
  sample.tail_log_mass.resize(size_t(s.seq_len));
  sample.ids.assign(size_t(entries), 0);
  const uint8_t* at = record;
  auto get_value = [&]() -> double {
    if (s.value_type == CacheValueType::float64) {
      double v;
      std::memcpy(&v, at, 8);
      at += 8;
      return v;
    }
    uint16_t h;
    std::memcpy(&h, at, 2);
    at += 2;
    return half_to_float(h);
  };
  for (double& v : sample.log_probs) v = get_value();
  for (double& v : sample.tail_log_mass) v = get_value();
  const int64_t bits = id_bits(s.vocab_size);
  int64_t bit = 0;
  for (int64_t& id : sample.ids)
    for (int64_t b = 0; b < bits; ++b, ++bit) id |= int64_t((at[bit / 8] >> (bit % 8)) & 1) << b;
  return sample;
}

TeacherCacheWriter::TeacherCacheWriter(std::string dir, TeacherCacheHeader header, bool resume)
    : dir_(std::move(dir)), header_(std::move(header)) {
  const fs::path path = fs::path(dir_) / kHeaderFile;
  if (fs::exists(path)) {
    if (!resume)
      throw UserError("teacher cache '" + dir_ +
                      "' exists; add --resume to go on writing it, or choose another --out");
    const std::string difference = first_difference(read_header(dir_), header_);
    if (!difference.empty())
      throw UserError("teacher cache '" + dir_ + "' was made with another " + difference +
                      "; resume it with what made it, or choose another --out");
    return;
  }
  if (resume) throw UserError("teacher cache '" + dir_ + "': nothing to resume (no cache.json)");
  make_directories(dir_);
  const std::string text = header_json(header_).dump(1) + "\n";
  write_through_partial(path.string(), std::vector<uint8_t>(text.begin(), text.end()));
}

TeacherCacheWriter::TeacherCacheWriter(std::string dir)
    : dir_(std::move(dir)), header_(read_header(dir_)) {}

int64_t TeacherCacheWriter::shard_count() const {
  const TeacherCacheShape& s = header_.shape;
  return (s.samples + s.samples_per_shard - 1) / s.samples_per_shard;
}

std::pair<int64_t, int64_t> TeacherCacheWriter::shard_samples(int64_t shard) const {
  const TeacherCacheShape& s = header_.shape;
  const int64_t first = shard * s.samples_per_shard;
  return {first, std::min(s.samples_per_shard, s.samples - first)};
}

std::string TeacherCacheWriter::shard_path(int64_t shard) const {
  return (fs::path(dir_) / shard_name(shard * header_.shape.samples_per_shard)).string();
}

bool TeacherCacheWriter::shard_done(int64_t shard) const {
  return fs::exists(shard_path(shard));
}

void TeacherCacheWriter::write_shard(int64_t shard,
                                     const std::vector<CachedSample>& samples) const {
  const auto [first, count] = shard_samples(shard);
  if (int64_t(samples.size()) != count)
    throw std::invalid_argument("write_shard: shard " + std::to_string(shard) + " holds " +
                                std::to_string(count) + " samples, not " +
                                std::to_string(samples.size()));
  const int64_t record = record_bytes(header_.shape);
  std::vector<uint8_t> bytes = shard_header_bytes({first, count, record});
  const size_t crcs_at = bytes.size();
  bytes.resize(crcs_at + 4 * size_t(count));
  for (int64_t i = 0; i < count; ++i) {
    const std::vector<uint8_t> r = encode_record(header_.shape, samples[size_t(i)]);
    const uint32_t crc = crc32c(r.data(), r.size());
    std::memcpy(bytes.data() + crcs_at + 4 * size_t(i), &crc, 4);
    bytes.insert(bytes.end(), r.begin(), r.end());
  }
  write_through_partial(shard_path(shard), bytes);
}

struct TeacherCacheReader::OpenShard {
  std::string path;
  int fd = -1;
  ShardHeader header;
  std::vector<uint32_t> crcs;
  ~OpenShard() {
    if (fd >= 0) ::close(fd);
  }
};

TeacherCacheReader::TeacherCacheReader(std::string dir)
    : dir_(std::move(dir)), header_(read_header(dir_)) {}

TeacherCacheReader::~TeacherCacheReader() = default;

void TeacherCacheReader::require_fingerprint(
    const std::map<std::string, std::string>& expected) const {
  for (const auto& [key, value] : expected) {
    auto held = header_.fingerprint.find(key);
    if (held == header_.fingerprint.end())
      throw UserError("teacher cache '" + dir_ + "' does not record its " + key);
    if (held->second != value)
      throw UserError("teacher cache '" + dir_ + "' was made for another " + key + " ('" +
                      held->second + "', this run has '" + value + "')");
  }
}

const TeacherCacheReader::OpenShard& TeacherCacheReader::shard_of(int64_t shard) const {
  auto found = open_.find(shard);
  if (found != open_.end()) return *found->second;
  const TeacherCacheShape& s = header_.shape;
  auto open = std::make_unique<OpenShard>();
  open->path = (fs::path(dir_) / shard_name(shard * s.samples_per_shard)).string();
  open->fd = ::open(open->path.c_str(), O_RDONLY);
  if (open->fd < 0)
    throw UserError("teacher cache: shard '" + open->path + "' is missing (the cache is not " +
                    "complete; engine_teacher_cache --resume finishes it)");
  const int64_t first = shard * s.samples_per_shard;
  const int64_t count = std::min(s.samples_per_shard, s.samples - first);
  const ShardHeader want{first, count, record_bytes(s)};
  const std::vector<uint8_t> expected = shard_header_bytes(want);
  std::vector<uint8_t> got(expected.size() + 4 * size_t(count));
  if (::pread(open->fd, got.data(), got.size(), 0) != ssize_t(got.size()))
    throw UserError("teacher cache: shard '" + open->path + "' is truncated (its header)");
  if (!std::equal(expected.begin(), expected.end(), got.begin()))
    throw UserError("teacher cache: shard '" + open->path + "' has a damaged or foreign header");
  const int64_t size = int64_t(fs::file_size(open->path));
  const int64_t whole = int64_t(got.size()) + count * want.record;
  if (size != whole)
    throw UserError("teacher cache: shard '" + open->path + "' has " + std::to_string(size) +
                    " bytes, not " + std::to_string(whole) + " (truncated or appended to)");
  open->header = want;
  open->crcs.resize(size_t(count));
  std::memcpy(open->crcs.data(), got.data() + expected.size(), 4 * size_t(count));
  return *open_.emplace(shard, std::move(open)).first->second;
}

void TeacherCacheReader::require_shards(int64_t samples) const {
  const int64_t per_shard = header_.shape.samples_per_shard;
  for (int64_t shard = 0; shard * per_shard < std::min(samples, header_.shape.samples); ++shard)
    shard_of(shard);
}

CachedSample TeacherCacheReader::read(int64_t sample) const {
  const TeacherCacheShape& s = header_.shape;
  if (sample < 0 || sample >= s.samples)
    throw UserError("teacher cache '" + dir_ + "' holds samples 0 to " +
                    std::to_string(s.samples - 1) + "; sample " + std::to_string(sample) +
                    " is beyond it");
  const OpenShard& shard = shard_of(sample / s.samples_per_shard);
  const int64_t index = sample - shard.header.first;
  std::vector<uint8_t> record(size_t(shard.header.record));
  const int64_t offset =
      kShardHeaderBytes + 4 + 4 * shard.header.count + index * shard.header.record;
  if (::pread(shard.fd, record.data(), record.size(), offset) != ssize_t(record.size()))
    throw UserError("teacher cache: shard '" + shard.path + "' cannot be read at sample " +
                    std::to_string(sample));
  if (crc32c(record.data(), record.size()) != shard.crcs[size_t(index)])
    throw UserError("teacher cache: shard '" + shard.path + "' fails its checksum at sample " +
                    std::to_string(sample) + " (the file is damaged)");
  return decode_record(s, record.data());
}

std::string TeacherCacheReader::describe() const {
  const TeacherCacheShape& s = header_.shape;
  const int64_t shards = (s.samples + s.samples_per_shard - 1) / s.samples_per_shard;
  int64_t present = 0, bytes = 0;
  for (int64_t k = 0; k < shards; ++k) {
    std::error_code error;
    const auto size = fs::file_size(fs::path(dir_) / shard_name(k * s.samples_per_shard), error);
    if (!error) ++present, bytes += int64_t(size);
  }
  std::ostringstream out;
  out << "teacher cache " << dir_ << "\n"
      << "  samples " << s.samples << " of " << s.seq_len << " tokens, top " << s.top_k
      << " of a vocabulary of " << s.vocab_size << " (" << id_bits(s.vocab_size) << "-bit ids, "
      << value_type_name(s.value_type) << " values)\n"
      << "  shards " << present << " of " << shards << " written, " << bytes << " bytes, "
      << double(record_bytes(s)) / double(s.seq_len) << " bytes per token\n";
  for (const auto& [key, value] : header_.fingerprint) out << "  " << key << ": " << value << "\n";
  return out.str();
}

}  // namespace retort::engine
