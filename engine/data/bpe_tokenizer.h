// engine/data/bpe_tokenizer.h: a Hugging Face tokenizer.json with a byte-level BPE model
// (GPT-2, Llama 3, Qwen2 style), ours: added and special tokens split out first (leftmost,
// longest), then the pre-tokenizer (a Split by regex, through PCRE2 with Unicode properties,
// and/or ByteLevel with its GPT-2 regex and prefix space), bytes mapped to GPT-2's printable
// characters, BPE merges applied by rank (a whole word in the vocabulary is taken as is when
// the model sets ignore_merges), and the post-processor's template (BOS and the like) when
// special tokens are asked for. Input that is not valid UTF-8 is decoded with U+FFFD
// replacements first, as Node's and Python's decoders do; Qwen2's NFC normalizer goes
// through ICU. What tokenizer.json may hold beyond this (other normalizers, byte fallback,
// other models) is refused with the key named.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace retort::engine {

class BpeTokenizer {
 public:
  // tokenizer.json, or a directory holding it (and tokenizer_config.json for BOS/EOS names).
  static BpeTokenizer load(const std::string& path);
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  // Ids of `text`; add_special_tokens applies the post-processor's template.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The text of `ids` (vocabulary entries mapped back to bytes; added tokens as written,
  // or left out with skip_special_tokens). Ids outside the vocabulary are skipped.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;
  // The vocabulary size (largest id + 1).
  int64_t vocab_size() const;
  // tokenizer_config.json's eos_token, when there is one.
  std::optional<int64_t> eos_id() const;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace retort::engine
