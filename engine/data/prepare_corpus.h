// engine/data/prepare_corpus.h: text files to one Megatron .bin/.idx dataset, in parallel.
// The input is cut into units: a .txt file is one document (one unit); a .jsonl file (one
// document per line, its "text" field) is cut at line ends into units of about chunk_bytes.
// With several workers, each forked process tokenizes every N-th unit into a part dataset
// and reports to the parent through a pipe; the parent shows progress and then appends the
// parts in unit order, so the output is byte for byte that of one worker. Torch-free.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/data/indexed_dataset.h"

namespace retort::engine {

struct PrepareOptions {
  std::string output;  // prefix of output.bin / output.idx
  TokenDtype dtype = TokenDtype::UInt16;
  int workers = 1;
  int64_t chunk_bytes = int64_t(64) << 20;
  bool progress = true;  // on stderr: redrawn in place on a terminal, else a line per 10%
};

struct PrepareStats {
  int64_t documents = 0, tokens = 0, bytes = 0;
  int64_t empty_documents = 0;  // no text but white space (kept: the tokenizer's ids only)
};

using DocumentEncoder = std::function<std::vector<int64_t>(const std::string& text)>;

PrepareStats prepare_corpus(const std::vector<std::filesystem::path>& files,
                            const DocumentEncoder& encode, const PrepareOptions& options);

}  // namespace retort::engine
