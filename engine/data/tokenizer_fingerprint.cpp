// engine/data/tokenizer_fingerprint.cpp: see tokenizer_fingerprint.h.
#include "engine/data/tokenizer_fingerprint.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/user_error.h"

namespace fs = std::filesystem;

namespace retort::engine {
namespace {

std::string fnv1a_hex(const std::string& bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, hash);
  return text;
}

std::string file_bytes(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in) throw UserError(what + ": cannot read '" + path.string() + "'");
  return bytes.str();
}

}  // namespace

std::string tokenizer_file_in(const std::string& folder) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::is_regular_file(fs::path(folder) / name)) return (fs::path(folder) / name).string();
  return "";
}

std::string tokenizer_fingerprint(const std::string& path, const std::string& what) {
  if (path == "bytes") return "bytes";
  fs::path file = path;
  if (fs::is_directory(file)) {
    const std::string inside = tokenizer_file_in(path);
    if (inside.empty())
      throw UserError(what + ": folder '" + path + "' holds no tokenizer.json or tokenizer.model");
    file = inside;
  }
  if (!fs::exists(file)) throw UserError(what + ": no such file '" + file.string() + "'");
  const std::string bytes = file_bytes(file, what);
  if (file.extension() == ".model") return "sentencepiece:" + fnv1a_hex(bytes);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(what + ": '" + file.string() + "' is not JSON (" + e.what() + ")");
  }
  if (!json.is_object() || !json.contains("model") || !json["model"].is_object())
    throw UserError(what + ": '" + file.string() +
                    "' is not a Hugging Face tokenizer.json (no \"model\" object)");
  // Object keys come out sorted: the same vocabulary hashes alike however the file orders it.
  const nlohmann::json& added =
      json.contains("added_tokens") ? json["added_tokens"] : nlohmann::json();
  return "bpe:" + fnv1a_hex(json["model"].dump() + "\n" + added.dump());
}

}  // namespace retort::engine
