// tools/engine_convert.cpp: Hugging Face Llama-family models in and out.
//   engine_convert import HF_DIR CHECKPOINT_DIR [--force] [--set-latest]
//   engine_convert export CHECKPOINT_DIR HF_DIR [--dtype F32|BF16|F16] [--shard-size BYTES]
//                  [--model-type phi3]
// Import reads config.json and model.safetensors (or its sharded form) into a Retort
// checkpoint; it refuses an existing checkpoint unless --force, and leaves the destination
// folder's `latest` alone unless --set-latest. Export writes config.json and safetensors
// (sharded above --shard-size, 5 GB by default, with model.safetensors.index.json), removing
// the weight files of an earlier export there first. A Hugging Face directory can also be
// used directly as teacher.checkpoint or model.init.from. Bad input: one line "error: ..."
// and exit code 2.
#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/hf/hf_export.h"
#include "parallel/mpi_runtime.h"

namespace fs = std::filesystem;
namespace po = boost::program_options;
using namespace retort;

namespace {

int convert(int argc, char** argv) {
  po::options_description visible(
      "Usage: engine_convert import HF_DIR CHECKPOINT_DIR\n"
      "       engine_convert export CHECKPOINT_DIR HF_DIR [options]");
  std::string dtype = "F32", model_type;
  int64_t shard_size = int64_t(5) << 30;  // signed, so that -5 is refused, not read as 2^64-5
  hf::ImportOptions import_options;
  visible.add_options()("help,h", "print this help and exit")("dtype", po::value(&dtype),
                                                              "export dtype: F32, BF16 or F16")(
      "shard-size", po::value(&shard_size), "export: largest safetensors file in bytes")(
      "model-type", po::value(&model_type),
      "export: phi3 writes Phi-3's layout (q, k, v and gate, up fused); default: the type "
      "that follows from the model")("force", po::bool_switch(&import_options.force),
                                     "import: replace an existing checkpoint at CHECKPOINT_DIR")(
      "set-latest", po::bool_switch(&import_options.set_latest),
      "import: point the `latest` file beside CHECKPOINT_DIR at the import");
  po::options_description all;
  std::vector<std::string> positional;
  all.add(visible).add_options()("args", po::value(&positional));
  po::positional_options_description p;
  p.add("args", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(p).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(e.what());
  }
  if (vm.count("help")) {
    std::cout << visible << "\n";
    return 0;
  }
  if (positional.size() != 3 || (positional[0] != "import" && positional[0] != "export"))
    throw UserError("expected 'import HF_DIR CHECKPOINT_DIR' or 'export CHECKPOINT_DIR HF_DIR'");
  if (positional[0] == "import") {
    hf::import_hf(positional[1], positional[2], import_options);
    std::cout << "imported " << positional[1] << " -> " << positional[2] << "\n";
    const fs::path latest = fs::path(positional[2]).parent_path() / "latest";
    if (!import_options.set_latest && fs::is_regular_file(latest)) {
      std::ifstream in(latest);
      std::string name;
      in >> name;
      std::cout << "left " << latest.string() << " naming '" << name
                << "' (--set-latest would point it at the import)\n";
    }
    return 0;
  }
  hf::ExportOptions options;
  const std::optional<hf::StDtype> parsed = hf::parse_dtype(dtype);
  if (!parsed ||
      (*parsed != hf::StDtype::F32 && *parsed != hf::StDtype::BF16 && *parsed != hf::StDtype::F16))
    throw UserError("--dtype: '" + dtype + "' is not F32, BF16 or F16");
  if (shard_size <= 0)
    throw UserError("--shard-size: must be a positive number of bytes, got " +
                    std::to_string(shard_size));
  options.dtype = *parsed;
  options.shard_bytes = uint64_t(shard_size);
  options.model_type = model_type;
  const std::vector<std::string> removed = hf::export_hf(positional[1], positional[2], options);
  if (!removed.empty()) {
    std::cout << "removed the weight files of an earlier export:";
    for (const std::string& name : removed) std::cout << " " << name;
    std::cout << "\n";
  }
  std::cout << "exported " << positional[1] << " -> " << positional[2] << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setup_process(argv);
  parallel::MpiRuntime mpi(&argc, &argv);
  try {
    return convert(argc, argv);
  } catch (const UserError& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}
