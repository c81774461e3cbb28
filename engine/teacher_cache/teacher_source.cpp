// engine/teacher_cache/teacher_source.cpp: see teacher_source.h.
#include "engine/teacher_cache/teacher_source.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <tuple>
#include <vector>

#include "common/user_error.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/hf/hf_model.h"
#include "kernels/crc32c.h"

namespace fs = std::filesystem;

namespace retort::engine {
namespace {

// The teacher.* sizes given in the config against the teacher's own description at `path`.
void require_teacher_sizes(const TeacherKeys& keys, const layers::ModelConfig& stored,
                           const std::string& path) {
  for (const auto& [key, given, held] :
       std::initializer_list<std::tuple<const char*, int64_t, int64_t>>{
           {"teacher.hidden", keys.hidden, stored.hidden},
           {"teacher.layers", keys.layers, stored.layers},
           {"teacher.heads", keys.heads, stored.heads},
           {"teacher.kv_heads", keys.kv_heads, stored.kv_heads},
           {"teacher.ffn_hidden", keys.ffn_hidden, stored.ffn_hidden},
           {"teacher.head_dim", keys.head_dim, stored.head_dim()}})
    if (given > 0 && given != held)
      throw UserError(std::string(key) + "=" + std::to_string(given) + ", but the teacher at '" +
                      path + "' has " + std::to_string(held) +
                      " (leave the teacher's sizes out to take its own)");
  if (keys.tied_embeddings != TeacherHead::as_student &&
      (keys.tied_embeddings == TeacherHead::tied) != stored.tied_embeddings)
    throw UserError("teacher.tied_embeddings=" + enum_name(keys.tied_embeddings) +
                    ", but the teacher at '" + path + "' has " +
                    (stored.tied_embeddings ? "a tied" : "an untied") +
                    " head (leave the key out to take its own)");
}

// CRC-32C of a whole file, read in blocks.
uint32_t file_crc(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("teacher: cannot read '" + path.string() + "'");
  std::vector<char> block(1 << 22);
  uint32_t crc = 0;
  while (in) {
    in.read(block.data(), std::streamsize(block.size()));
    crc = crc32c(block.data(), size_t(in.gcount()), crc);
  }
  return crc;
}

std::string hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", value);
  return text;
}

}  // namespace

std::string TeacherSource::identity() const {
  if (path.empty())
    return "initialised from seed " + std::to_string(seed) + ": " + model_config_json(model);
  if (!hf)
    return "retort checkpoint, index.json crc32c " + hex(file_crc(fs::path(path) / "index.json"));
  // The weights and the configuration, file by file in name order.
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || entry.path().extension() == ".safetensors")
      files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::string text = "hugging face folder";
  for (const fs::path& file : files)
    text += ", " + file.filename().string() + " crc32c " + hex(file_crc(file));
  return text;
}

TeacherSource resolve_teacher_source(const DistillSettings& settings) {
  TeacherSource source;
  source.model = settings.teacher;
  source.seed = uint64_t(settings.keys.seed);
  const std::string& given = settings.keys.checkpoint;
  if (given.empty()) return source;
  source.hf = hf::is_hf_model_dir(given);
  source.path = source.hf ? given : resolve_checkpoint(given);
  // The teacher's own description (a Hugging Face directory's config.json, or the
  // checkpoint's) decides everything about it, its RoPE scaling included; teacher.* sizes,
  // where given, must agree with it.
  const std::optional<layers::ModelConfig> stored =
      source.hf ? std::optional<layers::ModelConfig>(hf::read_hf_config(source.path))
                : read_checkpoint_model(source.path);
  if (stored) {
    require_teacher_sizes(settings.keys, *stored, source.path);
    source.model = *stored;
  }
  return source;
}

void load_teacher_weights(const TeacherSource& source, const layers::ModelConfig& built,
                          parallel::Mesh& mesh, const layers::TensorParallel& tp,
                          distill::Teacher& teacher, bool whole) {
  if (source.hf)  // its names are checked against the whole model's, whatever was built
    hf::load_hf_parameters(source.path, built, teacher.parameters(), tp);
  else if (!source.path.empty())
    load_checkpoint(source.path, mesh, teacher.parameters(), nullptr, !whole);
}

}  // namespace retort::engine
