// engine/teacher_cache/cache_fingerprint.cpp: see cache_fingerprint.h.
#include "engine/teacher_cache/cache_fingerprint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/user_error.h"
#include "kernels/crc32c.h"

namespace fs = std::filesystem;

namespace retort::engine {
namespace {

std::string file_summary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("teacher cache fingerprint: cannot read '" + path + "'");
  std::vector<char> block(1 << 22);
  uint32_t crc = 0;
  int64_t bytes = 0;
  while (in) {
    in.read(block.data(), std::streamsize(block.size()));
    crc = crc32c(block.data(), size_t(in.gcount()), crc);
    bytes += in.gcount();
  }
  char text[64];
  std::snprintf(text, sizeof text, " %lld bytes crc32c %08x", static_cast<long long>(bytes), crc);
  return fs::path(path).filename().string() + text;
}

std::string exact(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

}  // namespace

std::map<std::string, std::string> cache_fingerprint(const TrainConfig& config,
                                                     const std::string& teacher_identity,
                                                     const std::string& tokenizer) {
  const DataConfig& data = config.data;
  std::string datasets;
  for (size_t i = 0; i < data.paths.size(); ++i) {
    if (i > 0) datasets += "; ";
    datasets += file_summary(data.paths[i] + ".bin") + ", " + file_summary(data.paths[i] + ".idx") +
                ", weight " + exact(data.weights.at(i));
  }
  // The training documents are what the validation split leaves.
  datasets += data.valid_paths.empty() ? "; valid_fraction " + exact(data.valid_fraction)
                                       : "; validation from data.valid_paths";
  std::map<std::string, std::string> fields = {
      {"data", datasets},
      {"data_seed", std::to_string(data_order_seed(data, config.seed))},
      {"temperature", exact(config.distill.objective.logits.temperature)}};
  if (!teacher_identity.empty()) fields["teacher"] = teacher_identity;
  if (!tokenizer.empty()) fields["tokenizer"] = tokenizer;
  return fields;
}

}  // namespace retort::engine
