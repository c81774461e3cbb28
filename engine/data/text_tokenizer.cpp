// engine/data/text_tokenizer.cpp: see text_tokenizer.h.
#include "engine/data/text_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "common/user_error.h"
#include "engine/data/bpe_tokenizer.h"
#include "engine/data/utf8.h"

namespace fs = std::filesystem;

namespace retort::engine {
namespace {

class SentencePieceTokenizer : public TextTokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    const auto status = processor_.Load(path);
    if (!status.ok())
      throw UserError("--tokenizer '" + path + "': not a SentencePiece model (" +
                      status.ToString() + ")");
  }
  // Llama 2 and Mistral prepend BOS and add no EOS; EOS ends the document (the caller).
  std::vector<int64_t> encode(std::string_view text) const override {
    const std::string valid = utf8_lossy(text);
    std::vector<int> ids;
    processor_.Encode(valid, &ids);
    std::vector<int64_t> out;
    if (processor_.bos_id() >= 0) out.push_back(processor_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> pieces;
    for (int64_t id : ids)
      if (id >= 0 && id < processor_.GetPieceSize() && !processor_.IsControl(int(id)))
        pieces.push_back(int(id));
    std::string text;
    processor_.Decode(pieces, &text);
    return text;
  }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::optional<int64_t> eos_id() const override {
    if (processor_.eos_id() < 0) return std::nullopt;
    return processor_.eos_id();
  }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

class HfBpeTokenizer : public TextTokenizer {
 public:
  explicit HfBpeTokenizer(const std::string& path) : bpe_(BpeTokenizer::load(path)) {}
  std::vector<int64_t> encode(std::string_view text) const override {
    return bpe_.encode(text, true);
  }
  std::string decode(const std::vector<int64_t>& ids) const override { return bpe_.decode(ids); }
  int64_t vocab_size() const override { return bpe_.vocab_size(); }
  std::optional<int64_t> eos_id() const override { return bpe_.eos_id(); }

 private:
  BpeTokenizer bpe_;
};

}  // namespace

std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& path) {
  if (!fs::exists(path)) throw UserError("--tokenizer '" + path + "' does not exist");
  if (fs::path(path).extension() == ".model") return std::make_unique<SentencePieceTokenizer>(path);
  return std::make_unique<HfBpeTokenizer>(path);
}

}  // namespace retort::engine
