// engine/hf/hf_export.cpp: see hf_export.h.
#include "engine/hf/hf_export.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/machine_memory.h"
#include "common/make_directories.h"
#include "common/user_error.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/hf/hf_model.h"
#include "engine/hf/hf_phi3.h"
#include "layers/model.h"
#include "parallel/mesh.h"

namespace fs = std::filesystem;

namespace retort::hf {
namespace {

torch::ScalarType torch_dtype_of(StDtype dtype) {
  switch (dtype) {
    case StDtype::BF16:
      return torch::kBFloat16;
    case StDtype::F16:
      return torch::kHalf;
    case StDtype::F32:
      return torch::kFloat;
    default:
      throw UserError("export dtype must be F32, BF16 or F16");
  }
}

// Our names in the order Hugging Face writes them: embedding, layers by index, final norm,
// head.
std::vector<std::string> export_order(std::vector<std::string> names) {
  auto rank = [](const std::string& n) -> std::pair<int64_t, std::string> {
    if (n == "embed.weight") return {-1, n};
    if (n.rfind("layers.", 0) == 0) return {std::stoll(n.substr(7)), n};
    return {1 << 30, n};
  };
  std::sort(names.begin(), names.end(),
            [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  return names;
}

// The weight files an earlier export may have left in dir (and their .partial leftovers).
bool is_export_weight_file(const std::string& name) {
  static const std::regex pattern(
      R"((model\.safetensors|model-\d{5}-of-\d{5}\.safetensors|model\.safetensors\.index\.json)(\.partial)?)");
  return std::regex_match(name, pattern);
}

// Our name of a Llama-layout Hugging Face name of a layer ("model.layers.3.self_attn.q_proj.weight"
// -> "layers.3.attn.q_proj.weight"), the inverse of hf_name for the parts Phi-3 fuses.
std::string our_name(const std::string& theirs) {
  static const std::regex layer(R"(model\.layers\.(\d+)\.(self_attn|mlp)\.(.+))");
  std::smatch m;
  if (!std::regex_match(theirs, m, layer)) throw UserError("no Retort name for '" + theirs + "'");
  return "layers." + m[1].str() + "." + (m[2].str() == "self_attn" ? "attn" : "mlp") + "." +
         m[3].str();
}

void write_text(const fs::path& path, const std::string& text) {
  {
    std::ofstream out(path.string() + ".partial");
    out << text;
    if (!out) throw UserError("cannot write '" + path.string() + "'");
  }
  fs::rename(path.string() + ".partial", path);
}

}  // namespace

std::vector<std::string> export_hf(const std::string& checkpoint, const std::string& out_dir,
                                   const ExportOptions& options) {
  const std::optional<layers::ModelConfig> config = engine::read_checkpoint_model(checkpoint);
  if (!config)
    throw UserError("'" + checkpoint + "' has no model description (/model/config_json)");
  const torch::ScalarType dtype = torch_dtype_of(options.dtype);
  const engine::CheckpointReader reader(checkpoint);

  // Refused before anything is written: a layout the model cannot take.
  hf_config_json(*config, "float32", options.model_type);
  // The tensors, their Hugging Face names and shapes, grouped into shards by size.
  struct Item {
    std::vector<std::string> ours;  // joined along rows (Phi-3's fused tensors), else one
    std::string theirs;
    std::vector<int64_t> shape;
  };
  const bool phi3 = options.model_type == "phi3";
  std::set<std::string> fused_done;
  std::vector<std::vector<Item>> shards(1);
  uint64_t shard_size = 0, total = 0;
  for (const std::string& ours : export_order(reader.parameter_names())) {
    const std::optional<std::string> theirs = hf_name(ours);
    if (!theirs) continue;  // a distillation projection: not part of the model
    Item item{{ours}, *theirs, reader.shape(ours)};
    if (const std::optional<FusedRows> rows = phi3 ? phi3_rows(*theirs, *config) : std::nullopt) {
      if (!fused_done.insert(rows->tensor).second) continue;  // written with its first part
      item.theirs = rows->tensor;
      item.ours.clear();
      item.shape[0] = 0;
      for (const std::string& part : phi3_parts(rows->tensor)) {
        item.ours.push_back(our_name(part));
        item.shape[0] += reader.shape(item.ours.back())[0];
      }
    }
    const uint64_t bytes = uint64_t(torch::elementSize(dtype)) *
                           uint64_t(std::accumulate(item.shape.begin(), item.shape.end(),
                                                    int64_t(1), std::multiplies<int64_t>()));
    if (shard_size > 0 && shard_size + bytes > options.shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(item);
    shard_size += bytes;
    total += bytes;
  }
  make_directories(out_dir);
  std::vector<std::string> removed;
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || !is_export_weight_file(name)) continue;
    std::error_code error;
    fs::remove(e.path(), error);
    if (error)
      throw UserError("cannot remove '" + e.path().string() +
                      "' of an earlier export: " + error.message());
    removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file_name = shards.size() == 1 ? "model.safetensors" : name;
    std::vector<SafetensorsWriter::Entry> entries;
    for (const Item& item : shards[s]) entries.push_back({item.theirs, options.dtype, item.shape});
    SafetensorsWriter writer((fs::path(out_dir) / file_name).string(), entries, {{"format", "pt"}});
    for (const Item& item : shards[s]) {
      std::vector<torch::Tensor> parts;
      for (const std::string& ours : item.ours) parts.push_back(reader.parameter(ours).to(dtype));
      torch::Tensor t = (parts.size() == 1 ? parts[0] : torch::cat(parts, 0)).contiguous();
      writer.write(item.theirs, t.data_ptr(), size_t(t.numel() * t.element_size()));
      weight_map[item.theirs] = file_name;
    }
    writer.finish();
  }
  if (shards.size() > 1) {
    nlohmann::json index;
    index["metadata"]["total_size"] = total;
    index["weight_map"] = weight_map;
    write_text(fs::path(out_dir) / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  const char* type_name = dtype == torch::kBFloat16 ? "bfloat16"
                          : dtype == torch::kHalf   ? "float16"
                                                    : "float32";
  write_text(fs::path(out_dir) / "config.json",
             hf_config_json(*config, type_name, options.model_type));
  return removed;
}

void import_hf(const std::string& hf_dir, const std::string& checkpoint,
               const ImportOptions& options) {
  if (!is_hf_model_dir(hf_dir)) throw UserError("'" + hf_dir + "' has no config.json");
  // Nothing already saved is lost by mistake: an existing checkpoint is replaced only when
  // asked, and a folder that is not one (a run directory, say) never.
  const fs::path dest(checkpoint);
  if (fs::exists(dest)) {
    const bool empty_folder = fs::is_directory(dest) && fs::is_empty(dest);
    const bool is_checkpoint = fs::is_regular_file(dest / "index.json");
    if (!empty_folder && !is_checkpoint)
      throw UserError("'" + checkpoint +
                      "' exists and is not a Retort checkpoint; import into a new folder");
    if (is_checkpoint && !options.force)
      throw UserError("'" + checkpoint +
                      "' is an existing checkpoint; import into a new folder, or pass --force to "
                      "replace it (its parameters and optimizer state are lost)");
  }
  const layers::ModelConfig config = read_hf_config(hf_dir);
  require_memory(config.parameter_count() * 4, 1, "the model of '" + hf_dir + "' in float32");
  std::unique_ptr<parallel::Mesh> mesh = parallel::Mesh::single_process();
  layers::ParameterStore store(0, torch::kFloat);
  layers::LlamaModel model(config, store);
  load_hf_parameters(hf_dir, config, store, {});
  engine::TrainingProgress progress;
  progress.model_json = engine::model_config_json(config);
  engine::save_checkpoint(checkpoint, *mesh, store, nullptr, nullptr, progress, options.set_latest);
}

}  // namespace retort::hf
