// tools/engine_prepare_data.cpp: turns .txt files (one document each) and .jsonl files
// (one document per line, its "text" field) into a Megatron .bin/.idx dataset, with the
// built-in byte-level tokenizer or, with --tokenizer, a Hugging Face tokenizer.json
// (byte-level BPE) or a SentencePiece .model: each document is encoded with the tokenizer's
// special tokens (its template; BOS for SentencePiece) and ends with its EOS token unless
// --no-eos. Directories are
// searched for .txt and .jsonl files.
#include <algorithm>
#include <boost/program_options.hpp>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "common/make_directories.h"
#include "common/user_error.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/indexed_dataset.h"
#include "engine/data/prepare_corpus.h"
#include "engine/data/text_tokenizer.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace retort;
using namespace retort::engine;

namespace {

std::vector<fs::path> collect_inputs(const std::vector<std::string>& inputs) {
  std::vector<fs::path> files;
  for (const std::string& input : inputs) {
    if (fs::is_directory(input)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::directory_iterator(input)) {
        const auto ext = entry.path().extension();
        if (ext == ".txt" || ext == ".jsonl") found.push_back(entry.path());
      }
      std::sort(found.begin(), found.end());  // a stable document order
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(input)) {
      files.emplace_back(input);
    } else {
      throw UserError("input '" + input + "' does not exist");
    }
  }
  if (files.empty()) throw UserError("no .txt or .jsonl input files found");
  return files;
}

// Text has no NUL bytes (in UTF-8 or any 8-bit encoding); an executable, an archive or an
// image has many in its first kilobytes.
void refuse_binary(const std::vector<fs::path>& files) {
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::string head(65536, '\0');
    in.read(head.data(), std::streamsize(head.size()));
    head.resize(size_t(in.gcount()));
    const size_t nul = head.find('\0');
    if (nul != std::string::npos)
      throw UserError("input '" + file.string() + "' is not text (a NUL byte at offset " +
                      std::to_string(nul) + "); pass --allow-binary to tokenize it anyway");
  }
}

TokenDtype parse_dtype(const std::string& name) {
  if (name == "uint8") return TokenDtype::UInt8;
  if (name == "uint16") return TokenDtype::UInt16;
  if (name == "int32") return TokenDtype::Int32;
  if (name == "int64") return TokenDtype::Int64;
  throw UserError("--dtype '" + name + "': expected uint8, uint16, int32 or int64");
}

int prepare(int argc, char** argv) {
  po::options_description options(
      "Usage: engine_prepare_data --output PREFIX INPUT... (files or directories)");
  std::string output, dtype_name, tokenizer_path;
  int workers = 0;
  double chunk_mb = 64;
  options.add_options()("help,h", "print this help")("output,o", po::value<std::string>(&output),
                                                     "output prefix (writes PREFIX.bin, .idx)")(
      "dtype", po::value<std::string>(&dtype_name)->default_value("uint16"),
      "token dtype: uint8, uint16 (Megatron's choice below 65500 tokens), int32, int64; "
      "with --tokenizer, the smallest that holds its vocabulary unless given")(
      "tokenizer", po::value<std::string>(&tokenizer_path),
      "Hugging Face tokenizer.json (or its directory) or SentencePiece .model; default: the "
      "byte-level tokenizer")("no-eos", "do not end documents with the tokenizer's EOS token")(
      "workers", po::value<int>(&workers)->default_value(0),
      "processes tokenizing in parallel (0 = one per core); the output is the same")(
      "chunk-mb", po::value<double>(&chunk_mb)->default_value(64),
      "a .jsonl is cut into units of about this many MB, at line ends")(
      "allow-binary", "tokenize input files that are not text (holding NUL bytes)")(
      "quiet", "no progress on stderr")("input", po::value<std::vector<std::string>>(),
                                        "input files or directories");
  po::positional_options_description positional;
  positional.add("input", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(std::string("command line: ") + e.what());
  }
  if (vm.count("help")) {
    std::cout << options;
    return 0;
  }
  if (output.empty()) throw UserError("--output PREFIX is required");
  if (!vm.count("input")) throw UserError("no input files given");
  const ByteTokenizer bytes;
  std::unique_ptr<TextTokenizer> tokenizer;
  std::optional<int64_t> eos;
  if (!tokenizer_path.empty()) {
    tokenizer = load_text_tokenizer(tokenizer_path);
    if (!vm.count("no-eos")) {
      eos = tokenizer->eos_id();
      if (!eos)
        throw UserError("--tokenizer '" + tokenizer_path +
                        "': no eos_token in tokenizer_config.json (pass --no-eos)");
    }
    if (vm["dtype"].defaulted()) dtype_name = tokenizer->vocab_size() <= 65535 ? "uint16" : "int32";
    const int64_t limit = dtype_name == "uint8" ? 255 : dtype_name == "uint16" ? 65535 : INT64_MAX;
    if (tokenizer->vocab_size() - 1 > limit)
      throw UserError("--dtype " + dtype_name + " cannot hold the tokenizer's " +
                      std::to_string(tokenizer->vocab_size()) + " ids");
  }
  if (!fs::path(output).parent_path().empty())
    make_directories(fs::path(output).parent_path().string());
  const DocumentEncoder encode = [&](const std::string& text) {
    std::vector<int64_t> ids;
    if (tokenizer) {
      ids = tokenizer->encode(text);
      if (eos) ids.push_back(*eos);
    } else {
      ids = bytes.encode_document(text);
    }
    return ids;
  };
  if (workers < 0)
    throw UserError("--workers " + std::to_string(workers) +
                    ": a count of processes (0 = one per core)");
  if (!(chunk_mb > 0) || !std::isfinite(chunk_mb) || chunk_mb > 1e6) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%g", chunk_mb);
    throw UserError(std::string("--chunk-mb ") + shown + ": a size in MB above 0");
  }
  PrepareOptions prepare;
  prepare.output = output;
  prepare.dtype = parse_dtype(dtype_name);
  prepare.workers = workers > 0 ? workers : int(std::max(1u, std::thread::hardware_concurrency()));
  prepare.chunk_bytes = std::max<int64_t>(1, int64_t(chunk_mb * 1048576.0));
  prepare.progress = !vm.count("quiet");
  const std::vector<fs::path> files = collect_inputs(vm["input"].as<std::vector<std::string>>());
  if (!vm.count("allow-binary")) refuse_binary(files);
  const PrepareStats stats = prepare_corpus(files, encode, prepare);
  const int64_t documents = stats.documents, tokens = stats.tokens;
  std::cout << "wrote " << output << ".bin/.idx: " << documents << " documents, " << tokens
            << " tokens\n";
  if (stats.empty_documents > 0)
    std::cerr << "warning: " << stats.empty_documents << " of the " << documents
              << " documents are empty (no text but white space); each holds only the "
                 "tokenizer's own ids\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return prepare(argc, argv);
  } catch (const UserError& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}
