// tests/unit/teacher_cache_store_test.cpp: the teacher cache's files (engine/teacher_cache).
// float16 conversion against the format's own definition, every one of the 65536 values and
// the ties between neighbours; records that give back the float16-rounded values and the exact
// ids at every id width; shards written by one writer, and by one stopped and resumed, byte for
// byte alike; and every wrong cache (another fingerprint, a sample beyond it, a missing,
// truncated or damaged shard, a second writer without --resume) stopped with its line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/user_error.h"
#include "engine/teacher_cache/cache_store.h"
#include "engine/teacher_cache/half_float.h"
#include "tests/support/scratch_dir.h"
#include "tests/support/user_error_of.h"

namespace fs = std::filesystem;
using namespace retort;
using namespace retort::engine;
using retort::testing::error_of;

namespace {

// binary16's definition: sign, 5-bit exponent biased by 15, 10-bit fraction; subnormals below.
double half_by_definition(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, fraction = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(fraction, -24);
  if (exponent == 31) return fraction ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + fraction, exponent - 25);
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every file of a folder with its bytes.
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir))
    files[entry.path().filename().string()] = bytes_of(entry.path());
  return files;
}

TeacherCacheHeader small_header() {
  TeacherCacheHeader h;
  h.shape = {/*seq_len=*/6, /*top_k=*/3, /*vocab_size=*/300, /*samples=*/10,
             /*samples_per_shard=*/4};
  h.fingerprint = {{"teacher", "runs/teacher step 100"}, {"seq_len", "6"}, {"temperature", "1"}};
  return h;
}

CachedSample random_sample(const TeacherCacheShape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> lp(-30.0f, 0.0f);
  std::uniform_int_distribution<int64_t> id(0, s.vocab_size - 1);
  CachedSample sample;
  for (int64_t i = 0; i < s.seq_len * s.top_k; ++i) {
    sample.log_probs.push_back(lp(gen));
    sample.ids.push_back(id(gen));
  }
  for (int64_t p = 0; p < s.seq_len; ++p) sample.tail_log_mass.push_back(lp(gen));
  return sample;
}

void write_shards(TeacherCacheWriter& writer, const TeacherCacheShape& s,
                  const std::vector<int64_t>& shards) {
  for (int64_t shard : shards) {
    const auto [first, count] = writer.shard_samples(shard);
    std::vector<CachedSample> samples;
    for (int64_t i = first; i < first + count; ++i)
      samples.push_back(random_sample(s, uint32_t(i)));
    writer.write_shard(shard, samples);
  }
}

}  // namespace

TEST(HalfFloat, EveryValueAndEveryTieFollowTheDefinition) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = half_by_definition(uint16_t(h));
    const float got = half_to_float(uint16_t(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(got)))) << h;
      continue;
    }
    ASSERT_EQ(double(got), want) << h;
    ASSERT_EQ(float_to_half(got), h) << h;
  }
  // Between neighbours a < b (finite, positive and negative): the midpoint goes to the even
  // one, anything above it to b, below it to a; past the largest half, to infinity.
  for (uint32_t a = 0; a < 0x7bff; ++a)
    for (uint32_t sign : {0u, 0x8000u}) {
      const uint16_t lo = uint16_t(a | sign), hi = uint16_t((a + 1) | sign);
      const float mid = float((half_by_definition(lo) + half_by_definition(hi)) / 2);
      ASSERT_EQ(float_to_half(mid), (a & 1) ? hi : lo) << a;
      ASSERT_EQ(float_to_half(std::nextafter(mid, sign ? -INFINITY : INFINITY)), hi) << a;
      ASSERT_EQ(float_to_half(std::nextafter(mid, 0.0f)), lo) << a;
    }
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
}

TEST(TeacherCacheStore, RecordsGiveBackFloat16ValuesAndExactIds) {
  EXPECT_EQ(id_bits(1), 1);
  EXPECT_EQ(id_bits(2), 1);
  EXPECT_EQ(id_bits(256), 8);
  EXPECT_EQ(id_bits(257), 9);
  EXPECT_EQ(id_bits(151936), 18);
  for (int64_t vocab : {2, 5, 255, 256, 257, 300, 151936}) {
    const TeacherCacheShape s{7, std::min<int64_t>(3, vocab), vocab, 1, 1};
    CachedSample sample = random_sample(s, uint32_t(vocab));
    sample.ids[0] = vocab - 1;  // the widest id
    sample.ids[1] = 0;
    sample.tail_log_mass[2] = -INFINITY;  // all mass in the top k
    const std::vector<uint8_t> record = encode_record(s, sample);
    ASSERT_EQ(int64_t(record.size()), record_bytes(s)) << vocab;
    EXPECT_EQ(record_bytes(s), 2 * 7 * s.top_k + 2 * 7 + (7 * s.top_k * id_bits(vocab) + 7) / 8);
    const CachedSample back = decode_record(s, record.data());
    EXPECT_EQ(back.ids, sample.ids) << vocab;
    for (size_t i = 0; i < sample.log_probs.size(); ++i)
      EXPECT_EQ(back.log_probs[i], half_to_float(float_to_half(float(sample.log_probs[i])))) << i;
    for (size_t p = 0; p < sample.tail_log_mass.size(); ++p)
      EXPECT_EQ(back.tail_log_mass[p],
                half_to_float(float_to_half(float(sample.tail_log_mass[p]))));
  }
}

TEST(TeacherCacheStore, Float64RecordsGiveBackEveryBit) {
  TeacherCacheShape s{5, 4, 1000, 1, 1};
  s.value_type = CacheValueType::float64;
  CachedSample sample = random_sample(s, 7);
  for (double& v : sample.log_probs) v = std::nextafter(v, 0.0) / 3.0;  // beyond float32's bits
  sample.tail_log_mass[1] = -INFINITY;
  const std::vector<uint8_t> record = encode_record(s, sample);
  ASSERT_EQ(int64_t(record.size()), record_bytes(s));
  EXPECT_EQ(record_bytes(s), 8 * (5 * 4 + 5) + (5 * 4 * id_bits(1000) + 7) / 8);
  const CachedSample back = decode_record(s, record.data());
  EXPECT_EQ(back.log_probs, sample.log_probs);
  EXPECT_EQ(back.tail_log_mass, sample.tail_log_mass);
  EXPECT_EQ(back.ids, sample.ids);
  EXPECT_EQ(parse_value_type("float64", "--values"), CacheValueType::float64);
  EXPECT_NE(error_of([] { parse_value_type("bfloat16", "--values"); }).find("--values"),
            std::string::npos);
}

TEST(TeacherCacheStore, ResumedWritingGivesTheBytesOfOneWriter) {
  const fs::path root = retort::testing::scratch_dir("teacher_cache_resume");
  const TeacherCacheHeader h = small_header();
  {
    TeacherCacheWriter whole((root / "whole").string(), h, false);
    ASSERT_EQ(whole.shard_count(), 3);  // 4 + 4 + 2 samples
    EXPECT_EQ(whole.shard_samples(2), std::make_pair(int64_t(8), int64_t(2)));
    write_shards(whole, h.shape, {0, 1, 2});
  }
  {
    TeacherCacheWriter first((root / "resumed").string(), h, false);
    write_shards(first, h.shape, {2, 0});
    std::ofstream(first.shard_path(1) + ".partial") << "killed midway";  // a write cut short
  }
  TeacherCacheWriter resumed((root / "resumed").string(), h, true);
  for (int64_t shard = 0; shard < resumed.shard_count(); ++shard)
    if (!resumed.shard_done(shard)) write_shards(resumed, h.shape, {shard});
  EXPECT_EQ(folder_bytes(root / "resumed"), folder_bytes(root / "whole"));

  const TeacherCacheReader reader((root / "resumed").string());
  for (int64_t i : {0, 5, 9}) {
    const CachedSample want = random_sample(h.shape, uint32_t(i)), got = reader.read(i);
    EXPECT_EQ(got.ids, want.ids) << i;
    EXPECT_EQ(got.log_probs[4], half_to_float(float_to_half(float(want.log_probs[4])))) << i;
  }
  EXPECT_NE(reader.describe().find("shards 3 of 3 written"), std::string::npos)
      << reader.describe();
}

TEST(TeacherCacheStore, WrongCachesStopWithTheirLine) {
  const fs::path root = retort::testing::scratch_dir("teacher_cache_wrong");
  const TeacherCacheHeader h = small_header();
  const std::string dir = (root / "cache").string();
  TeacherCacheWriter writer(dir, h, false);
  write_shards(writer, h.shape, {0, 1, 2});
  const auto before = folder_bytes(dir);

  EXPECT_NE(error_of([&] { TeacherCacheWriter again(dir, h, false); }).find("exists; add --resume"),
            std::string::npos);
  TeacherCacheHeader other = h;
  other.fingerprint["teacher"] = "another teacher";
  EXPECT_NE(error_of([&] { TeacherCacheWriter again(dir, other, true); })
                .find("was made with another fingerprint.teacher ('runs/teacher step 100' in the "
                      "cache, 'another teacher' asked)"),
            std::string::npos);
  other = h;
  other.shape.top_k = 4;
  EXPECT_NE(error_of([&] { TeacherCacheWriter again(dir, other, true); }).find("another top_k"),
            std::string::npos);
  EXPECT_EQ(folder_bytes(dir), before) << "a refused writer touched the cache";

  EXPECT_NE(error_of([&] {
              TeacherCacheReader(dir).require_fingerprint({{"temperature", "2"}});
            }).find("was made for another temperature ('1', this run has '2')"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TeacherCacheReader(dir).read(10);
            }).find("holds samples 0 to 9; sample 10 is beyond it"),
            std::string::npos);

  // A flipped byte in sample 5's record, in a shard's header; a truncated and a missing shard.
  const std::string shard1 = writer.shard_path(1), shard2 = writer.shard_path(2);
  const std::string original1 = bytes_of(shard1);
  auto overwrite = [](const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  std::string flipped = original1;
  const size_t record5 = 44 + 4 * 4 + 1 * size_t(record_bytes(h.shape)) + 3;
  flipped[record5] = char(flipped[record5] ^ 0x10);
  overwrite(shard1, flipped);
  EXPECT_NE(error_of([&] {
              TeacherCacheReader(dir).read(5);
            }).find("fails its checksum at sample 5 (the file is damaged)"),
            std::string::npos);
  EXPECT_EQ(TeacherCacheReader(dir).read(4).ids, random_sample(h.shape, 4).ids);  // its neighbour
  flipped = original1;
  flipped[20] = char(flipped[20] ^ 1);  // the first sample's number
  overwrite(shard1, flipped);
  EXPECT_NE(error_of([&] { TeacherCacheReader(dir).read(4); }).find("damaged or foreign header"),
            std::string::npos);
  overwrite(shard1, original1.substr(0, original1.size() - 1));
  EXPECT_NE(error_of([&] { TeacherCacheReader(dir).read(4); }).find("(truncated or appended to)"),
            std::string::npos);
  fs::remove(shard2);
  EXPECT_NE(error_of([&] { TeacherCacheReader(dir).read(9); }).find("is missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TeacherCacheReader((root / "none").string());
            }).find("no cache.json (not a teacher cache)"),
            std::string::npos);
}
