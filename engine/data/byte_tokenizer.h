// engine/data/byte_tokenizer.h: the built-in byte-level tokenizer: token = byte value (vocab 256).
// Each document ends with an end-of-document token, id 0: the NUL byte, which text never holds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace retort::engine {

struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;
  static constexpr int64_t kEndOfDocument = 0;
  std::vector<int64_t> encode_document(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& tokens) const;
};

}  // namespace retort::engine
