// engine/train/tokenizer_identity.h: which tokenizer a run's student and teacher speak, where
// it can be told (data.tokenizer; a Hugging Face folder's own tokenizer file; the fingerprint a
// Retort checkpoint records), and the one-line stop when two that should be one differ.
#pragma once
#include <string>

namespace retort::engine {

struct TokenizerIdentity {
  std::string fingerprint;  // engine/data/tokenizer_fingerprint.h; "" = not known
  std::string source;       // where it was told, for the error line
  bool known() const { return !fingerprint.empty(); }
};

// data.tokenizer's (unknown when the key is empty).
TokenizerIdentity tokenizer_of_data(const std::string& key_value);
// A Hugging Face model folder's tokenizer file, or what a Retort checkpoint records.
TokenizerIdentity tokenizer_of_model(const std::string& path, bool hf_folder);

// UserError when both are known and differ: "<what>: <a.source> (<fp>) and <b.source> (<fp>)
// are different tokenizers; <consequence>".
void require_same_tokenizer(const TokenizerIdentity& a, const TokenizerIdentity& b,
                            const std::string& what, const std::string& consequence);
// `known` where it is known, else `fallback`.
TokenizerIdentity known_of(const TokenizerIdentity& known, const TokenizerIdentity& fallback);

}  // namespace retort::engine
