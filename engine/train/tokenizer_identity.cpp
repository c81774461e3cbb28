// engine/train/tokenizer_identity.cpp: see tokenizer_identity.h.
#include "engine/train/tokenizer_identity.h"

#include "common/user_error.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/data/tokenizer_fingerprint.h"

namespace retort::engine {

TokenizerIdentity tokenizer_of_data(const std::string& key_value) {
  if (key_value.empty()) return {};
  return {tokenizer_fingerprint(key_value, "data.tokenizer"), "data.tokenizer '" + key_value + "'"};
}

TokenizerIdentity tokenizer_of_model(const std::string& path, bool hf_folder) {
  if (!hf_folder) return {read_checkpoint_tokenizer(path), "checkpoint '" + path + "'"};
  const std::string file = tokenizer_file_in(path);
  if (file.empty()) return {};
  return {tokenizer_fingerprint(file, "the tokenizer of '" + path + "'"), "'" + file + "'"};
}

void require_same_tokenizer(const TokenizerIdentity& a, const TokenizerIdentity& b,
                            const std::string& what, const std::string& consequence) {
  if (!a.known() || !b.known() || a.fingerprint == b.fingerprint) return;
  throw UserError(what + ": " + a.source + " (" + a.fingerprint + ") and " + b.source + " (" +
                  b.fingerprint + ") are different tokenizers; " + consequence);
}

TokenizerIdentity known_of(const TokenizerIdentity& known, const TokenizerIdentity& fallback) {
  return known.known() ? known : fallback;
}

}  // namespace retort::engine
