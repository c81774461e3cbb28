// tools/engine_generate.cpp: text from a trained model.
//   engine_generate CHECKPOINT --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K]
//                   [--seed S] [--context N] [--tokenizer PATH|bytes] [--no-cache]
// CHECKPOINT: a Retort checkpoint or run directory, or a Hugging Face directory. Under
// `mpirun -np N` the model is split over N tensor-parallel ranks. The tokenizer: --tokenizer
// (a tokenizer.json, its directory, or "bytes"), else the Hugging
// Face directory's own tokenizer.json, else the byte tokenizer for vocabularies of 256.
// Prints the prompt and its continuation; bad input: one line "error: ..." and exit code 2.
#include <mpi.h>
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/data/bpe_tokenizer.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/generate/generator.h"
#include "engine/hf/hf_model.h"
#include "parallel/mesh.h"
#include "parallel/mpi_runtime.h"
#include "parallel/rank_device.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace retort;

namespace {

// Text <-> ids for the model's vocabulary.
struct Codec {
  std::optional<engine::BpeTokenizer> text;  // none: bytes
  std::vector<int64_t> encode(const std::string& s) const {
    if (text) return text->encode(s, true);
    return std::vector<int64_t>(s.begin(), s.end());  // bytes, no end-of-document token
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    return text ? text->decode(ids) : engine::ByteTokenizer().decode(ids);
  }
  std::optional<int64_t> stop() const {
    return text ? text->eos_id() : std::optional<int64_t>(engine::ByteTokenizer::kEndOfDocument);
  }
};

Codec choose_tokenizer(const std::string& flag, const std::string& checkpoint, int64_t vocab) {
  Codec codec;
  std::string path = flag;
  if (path.empty() && hf::is_hf_model_dir(checkpoint) &&
      fs::exists(fs::path(checkpoint) / "tokenizer.json"))
    path = checkpoint;
  if (path.empty() || path == "bytes") {
    if (vocab != engine::ByteTokenizer::kVocabSize)
      throw UserError("--tokenizer: the model has a vocabulary of " + std::to_string(vocab) +
                      " tokens, not bytes; pass the tokenizer.json or .model it was trained with");
    return codec;
  }
  if (fs::path(path).extension() == ".model")
    throw UserError("--tokenizer '" + path + "': SentencePiece models are not read by " +
                    "engine_generate (libsentencepiece's protobuf clashes with libtorch's in " +
                    "one process); use the model's tokenizer.json");
  codec.text = engine::BpeTokenizer::load(path);
  if (codec.text->vocab_size() > vocab)
    throw UserError("--tokenizer '" + path + "' has " + std::to_string(codec.text->vocab_size()) +
                    " tokens but the model only " + std::to_string(vocab));
  return codec;
}

int run(int argc, char** argv, const parallel::MpiRuntime& mpi) {
  po::options_description visible(
      "Usage: engine_generate CHECKPOINT --prompt TEXT [options]\n"
      "CHECKPOINT: a Retort checkpoint or run directory, or a Hugging Face model directory");
  std::string prompt, tokenizer, device_name;
  engine::SamplingOptions options;
  visible.add_options()("help,h", "print this help and exit")("prompt", po::value(&prompt),
                                                              "the text to continue")(
      "max-tokens", po::value(&options.max_tokens)->default_value(200), "tokens to generate")(
      "temperature", po::value(&options.temperature)->default_value(0.8),
      "softmax temperature; 0 = greedy")("top-k", po::value(&options.top_k)->default_value(40),
                                         "sample among the k likeliest tokens; 0 = all")(
      "seed", po::value(&options.seed)->default_value(1234), "sampling seed")(
      "context", po::value(&options.context)->default_value(0),
      "positions the model sees at most (its training length); longer text slides, 0 = no limit")(
      "tokenizer", po::value(&tokenizer), "tokenizer.json, its directory, or 'bytes'")(
      "no-cache", "recompute the whole prefix for every token (no KV cache)")(
      "device", po::value(&device_name)->default_value("cpu"),
      "cpu, or cuda: each rank on the GPU of its local rank");
  po::options_description all;
  std::vector<std::string> positional;
  all.add(visible).add_options()("checkpoint", po::value(&positional));
  po::positional_options_description p;
  p.add("checkpoint", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(p).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(e.what());
  }
  const bool root = mpi.world_rank() == 0;
  if (vm.count("help")) {
    if (root) std::cout << visible << "\n";
    return 0;
  }
  if (positional.size() != 1) throw UserError("expected one CHECKPOINT (see --help)");
  if (!vm.count("prompt") || prompt.empty()) throw UserError("--prompt: give the text to continue");
  if (options.max_tokens < 1) throw UserError("--max-tokens: must be at least 1");
  if (options.temperature < 0) throw UserError("--temperature: must not be negative");
  if (options.top_k < 0) throw UserError("--top-k: must not be negative");
  if (options.context < 0 || options.context == 1)
    throw UserError("--context: 0 (no limit) or at least 2 positions");
  set_compute_threads(mpi.threads_per_rank());
  parallel::Layout layout;
  layout.tensor = mpi.world_size();
  layout.data = 1;
  parallel::Mesh mesh(layout);
  if (device_name != "cpu" && device_name != "cuda")
    throw UserError("--device '" + device_name + "': cpu or cuda");
  const torch::Device device =
      parallel::rank_device(device_name == "cuda", mpi.local_rank(), 0, "--device cuda");
  mesh.choose_transports(parallel::TransportChoice::automatic,
                         device.is_cuda() ? device.index() : -1);
  engine::InferenceModel m =
      engine::load_inference_model(positional[0], mesh, torch::kFloat, device);
  const Codec codec = choose_tokenizer(tokenizer, positional[0], m.config.vocab_size);
  options.stop_token = codec.stop();
  const std::vector<int64_t> ids = codec.encode(prompt);
  if (root && vm["context"].defaulted() && m.trained_context > 0 &&
      int64_t(ids.size()) > m.trained_context)
    std::cerr << "warning: the prompt is " << ids.size() << " tokens, longer than the "
              << m.trained_context << " positions the model was trained on; its output past them "
              << "is unreliable. --context " << m.trained_context
              << " slides a window of that length instead\n";
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> out = engine::generate(*m.model, ids, options, !vm.count("no-cache"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (root) {
    std::cout << prompt << codec.decode(out) << std::endl;
    std::cerr << "engine_generate: " << out.size() << " tokens in " << seconds << " s ("
              << double(out.size()) / seconds << " tok/s), " << mpi.world_size() << " TP rank(s), "
              << (vm.count("no-cache") ? "no KV cache" : "KV cache") << ", from " << m.source
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setup_process(argv);
  parallel::MpiRuntime mpi(&argc, &argv);
  try {
    return run(argc, argv, mpi);
  } catch (const UserError& e) {
    parallel::MpiRuntime::exit_on_user_error(e.what());
  }
}
