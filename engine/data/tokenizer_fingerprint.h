// engine/data/tokenizer_fingerprint.h: which tokenizer a model's ids mean, as a short string
// two runs can compare: "bytes" for the built-in byte tokenizer; "bpe:<hash>" for a Hugging
// Face tokenizer.json, from its vocabulary, merges and added tokens only (a file that differs in
// padding or truncation settings means the same ids); "sentencepiece:<hash>" for a .model, from
// its bytes. The hash is 64-bit FNV-1a: it tells tokenizers apart, it is no security measure.
// Checkpoints record the fingerprint of the tokenizer their run's data was made with
// (data.tokenizer); a distillation compares its teacher's with its student's.
#pragma once
#include <string>

namespace retort::engine {

// The fingerprint of `path`: "bytes", a tokenizer.json, a SentencePiece .model, or a folder
// holding tokenizer.json or tokenizer.model. Bad input: UserError naming `what` and the path.
std::string tokenizer_fingerprint(const std::string& path, const std::string& what);

// The tokenizer file a model folder ships (tokenizer.json, else tokenizer.model); "" if none.
std::string tokenizer_file_in(const std::string& folder);

}  // namespace retort::engine
