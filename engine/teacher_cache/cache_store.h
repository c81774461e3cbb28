// engine/teacher_cache/cache_store.h: the teacher cache on disk. For every position of every
// dataset sample it holds a teacher's k largest log-probabilities (normalised over the whole
// vocabulary), their ids, and the log of the probability mass outside them (the tail), so
// students can learn the teacher's logits without running it. Addressed by dataset sample,
// not by step, so any batch size, seed, DP size or layout reads the right entries.
//
// A cache is a folder:
//   cache.json   the header, written once when the cache is made: format and version, the
//                shape (seq_len, top_k, vocab_size, samples, samples_per_shard) and the
//                fingerprint of what the values depend on (named fields: teacher, tokenizer,
//                data, temperature, ...), compared field by field with what a reader expects.
//   shard_<first sample, 10 digits>.bin   samples_per_shard consecutive samples (the last
//                shard fewer): a header (magic, version, first sample, count, record bytes)
//                and its CRC-32C, one CRC-32C per record, then the records. Written to .partial,
//                fsynced, then renamed: a shard under its final name is whole. Shards are
//                independent: ranks write their own, and a writer resumes by skipping those
//                that exist, giving the bytes one uninterrupted writer gives.
// A record (one sample, fixed size): seq_len x top_k log-probabilities and seq_len tail
// log-masses in the cache's value type (float16 by default, half_float.h says why; float64 for
// caches that must give the teacher's values exactly, as the tests comparing a cached student
// with an online one in float64 need), then the seq_len x top_k ids packed
// little-endian at id_bits(vocab_size) bits each, the last byte padded with zeros.
// Everything that is wrong (a header from another run, a sample beyond the cache, a missing or
// truncated shard, a flipped byte) is a UserError naming the file and the field or sample.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace retort::engine {

// How the log-probabilities are stored: their name in cache.json and --values.
enum class CacheValueType { float16, float64 };
const char* value_type_name(CacheValueType type);
// The type named `name`; throws UserError naming `what` (the flag or file) otherwise.
CacheValueType parse_value_type(const std::string& name, const std::string& what);

struct TeacherCacheShape {
  int64_t seq_len = 0, top_k = 0, vocab_size = 0;
  int64_t samples = 0;            // samples the cache covers: 0 .. samples - 1
  int64_t samples_per_shard = 0;  // consecutive samples per shard file
  CacheValueType value_type = CacheValueType::float16;
};

struct TeacherCacheHeader {
  TeacherCacheShape shape;
  std::map<std::string, std::string> fingerprint;  // what the values depend on, by name
};

// The folder of a cache's validation samples: DIR/valid, a cache of its own whose fingerprint's
// split is "validation" (the training samples' is "training").
inline std::string validation_cache_dir(const std::string& dir) {
  return dir + "/valid";
}

// Bits per packed id: enough for vocab_size - 1 (at least 1).
int64_t id_bits(int64_t vocab_size);
// Bytes of one sample's record.
int64_t record_bytes(const TeacherCacheShape& shape);

// One sample's entries, position-major: position p's k entries are [p * top_k, (p + 1) * top_k).
struct CachedSample {
  std::vector<double> log_probs;      // [seq_len * top_k]
  std::vector<int64_t> ids;           // [seq_len * top_k], each in [0, vocab_size)
  std::vector<double> tail_log_mass;  // [seq_len]
};

// The record's bytes, and back (values rounded to the value type on the way).
std::vector<uint8_t> encode_record(const TeacherCacheShape& shape, const CachedSample& sample);
CachedSample decode_record(const TeacherCacheShape& shape, const uint8_t* record);

class TeacherCacheWriter {
 public:
  // Makes `dir` and its cache.json; with `resume`, opens the cache already there instead, whose
  // header must equal `header` (one line naming the first field that differs). A folder that
  // already holds a cache is refused without `resume`, and nothing in it is touched.
  TeacherCacheWriter(std::string dir, TeacherCacheHeader header, bool resume);
  // Opens the cache another process (rank) made in `dir`, with the header it wrote there.
  explicit TeacherCacheWriter(std::string dir);
  const TeacherCacheHeader& header() const { return header_; }
  int64_t shard_count() const;
  // The samples of a shard: {first, count}.
  std::pair<int64_t, int64_t> shard_samples(int64_t shard) const;
  bool shard_done(int64_t shard) const;
  // Writes a whole shard (its samples, in order) through a .partial file.
  void write_shard(int64_t shard, const std::vector<CachedSample>& samples) const;
  std::string shard_path(int64_t shard) const;

 private:
  std::string dir_;
  TeacherCacheHeader header_;
};

class TeacherCacheReader {
 public:
  explicit TeacherCacheReader(std::string dir);
  ~TeacherCacheReader();
  const TeacherCacheHeader& header() const { return header_; }
  // One line naming the first field of `expected` the cache was not made with.
  void require_fingerprint(const std::map<std::string, std::string>& expected) const;
  // Opens every shard holding samples 0 .. samples - 1 and checks its header and size, so a
  // missing or truncated one stops a run before its first step (records' CRCs are checked as
  // they are read).
  void require_shards(int64_t samples) const;
  // A sample's entries, its record's CRC checked.
  CachedSample read(int64_t sample) const;
  // The header, the shards present and the bytes per token, for engine_teacher_cache --info.
  std::string describe() const;

 private:
  struct OpenShard;
  const OpenShard& shard_of(int64_t shard) const;
  std::string dir_;
  TeacherCacheHeader header_;
  mutable std::map<int64_t, std::unique_ptr<OpenShard>> open_;
};

}  // namespace retort::engine
