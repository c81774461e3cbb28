// engine/data/text_tokenizer.h: the tokenizers engine_prepare_data can use behind one
// interface, chosen by the path: a SentencePiece .model (Llama 2, Mistral; through Debian's
// libsentencepiece), or a Hugging Face tokenizer.json / its directory (byte-level BPE, ours,
// engine/data/bpe_tokenizer.h). Text that is not valid UTF-8 is decoded with U+FFFD
// replacements first, as Python's and Node's decoders do.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace retort::engine {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // A document's ids, with the tokenizer's own special tokens (BOS and the like).
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // The text of ids, special tokens left out (for generated samples).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> eos_id() const = 0;
};

std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& path);

}  // namespace retort::engine
