// engine/data/byte_tokenizer.cpp: see byte_tokenizer.h.
#include "engine/data/byte_tokenizer.h"

namespace retort::engine {

std::vector<int64_t> ByteTokenizer::encode_document(const std::string& text) const {
  std::vector<int64_t> tokens;
  tokens.reserve(text.size() + 1);
  for (unsigned char c : text)
    if (c != 0) tokens.push_back(c);
  tokens.push_back(kEndOfDocument);
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& tokens) const {
  std::string text;
  for (int64_t t : tokens) text += t == kEndOfDocument ? '\n' : static_cast<char>(t);
  return text;
}

}  // namespace retort::engine
