// engine/hf/hf_model.cpp: see hf_model.h.
#include "engine/hf/hf_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "common/user_error.h"
#include "engine/hf/hf_phi3.h"
#include "layers/sharding.h"

namespace fs = std::filesystem;

namespace retort::hf {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError("cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    // Python's json writes NaN and Infinity, which JSON has no words for.
    throw UserError("'" + path + "' is not valid JSON at byte " + std::to_string(e.byte) +
                    " (NaN or Infinity are not JSON numbers)");
  }
  if (!j.is_object()) throw UserError("'" + path + "' is not a JSON object");
  return j;
}

// A whole number, as JSON may write it (64 or 64.0), or a finite real.
template <typename T>
T number_of(const nlohmann::json& value, const std::string& key, const std::string& source) {
  if (!value.is_number())
    throw UserError("'" + source + "': key '" + key + "' has the wrong type (a number)");
  const double v = value.get<double>();
  if constexpr (std::is_integral_v<T>) {
    if (value.is_number_integer()) return value.get<T>();
    if (!(std::abs(v) < 9e18) || v != std::floor(v))
      throw UserError("'" + source + "': key '" + key + "' is " + value.dump() +
                      ", not a whole number");
    return T(v);
  } else {
    if (!std::isfinite(v))
      throw UserError("'" + source + "': key '" + key + "' is not a finite number");
    return T(v);
  }
}

// The range Retort's own key for the same field allows (layers/model_config.h), so a
// Hugging Face config is held to what a Retort config would be.
struct ModelKeyRange {
  double min, max;
};
ModelKeyRange model_key_range(const std::string& retort_key) {
#define RETORT_KEY_RANGE(type, member, path, fallback, min, max, help) \
  if (retort_key == path) return {double(min), double(max)};
  RETORT_MODEL_KEYS(RETORT_KEY_RANGE)
#undef RETORT_KEY_RANGE
  return {-kUnbounded, kUnbounded};
}

void check_in_range(double value, const std::string& hf_key, const std::string& retort_key,
                    const std::string& source) {
  const ModelKeyRange range = model_key_range(retort_key);
  if (value >= range.min && value <= range.max) return;
  std::ostringstream message;
  message << "'" << source << "': " << hf_key << " " << value << " is outside [" << range.min
          << ", " << range.max << "] (as " << retort_key << ")";
  throw UserError(message.str());
}

template <typename T>
T get_key(const nlohmann::json& j, const std::string& key, const std::string& source) {
  if (!j.contains(key) || j[key].is_null())
    throw UserError("'" + source + "': key '" + key + "' is missing");
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    return number_of<T>(j[key], key, source);
  } else {
    try {
      return j[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      throw UserError("'" + source + "': key '" + key + "' has the wrong type");
    }
  }
}

template <typename T>
T get_or(const nlohmann::json& j, const std::string& key, T fallback, const std::string& source) {
  return j.contains(key) && !j[key].is_null() ? get_key<T>(j, key, source) : fallback;
}

torch::ScalarType torch_dtype(StDtype dtype) {
  switch (dtype) {
    case StDtype::F64:
      return torch::kDouble;
    case StDtype::F32:
      return torch::kFloat;
    case StDtype::F16:
      return torch::kHalf;
    case StDtype::BF16:
      return torch::kBFloat16;
    default:
      return torch::kByte;  // not a weight dtype: refused by read()
  }
}

}  // namespace

bool is_hf_model_dir(const std::string& path) {
  return fs::is_directory(path) && fs::is_regular_file(fs::path(path) / "config.json");
}

std::string read_hf_model_type(const std::string& dir) {
  const std::string source = (fs::path(dir) / "config.json").string();
  return get_key<std::string>(read_json(source), "model_type", source);
}

int64_t read_hf_max_positions(const std::string& dir) {
  const nlohmann::json j = read_json((fs::path(dir) / "config.json").string());
  const auto it = j.find("max_position_embeddings");
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

namespace {

// The RoPE settings object `rope` (config.json's `key`) into c: rope_theta, and the scaling of
// its frequencies as transformers reads them (modeling_rope_utils.py); what Retort cannot
// compute stops, naming the field.
void read_rope_scaling(const nlohmann::json& rope, const std::string& key, const nlohmann::json& j,
                       const std::string& source, layers::ModelConfig& c) {
  for (const auto& [name, value] : rope.items())
    if (value.is_object())
      throw UserError("'" + source + "': " + key + "." + name +
                      ": RoPE settings per kind of layer are not supported");
  const std::string type = rope.contains("rope_type")
                               ? get_key<std::string>(rope, "rope_type", source)
                               : get_or<std::string>(rope, "type", "default", source);
  if (rope.contains("rope_theta") && !rope["rope_theta"].is_null())
    c.rope_theta = get_key<double>(rope, "rope_theta", source);
  if (get_or<double>(rope, "partial_rotary_factor", 1.0, source) != 1.0)
    throw UserError("'" + source + "': " + key +
                    ".partial_rotary_factor (RoPE on part of each head) is not supported");
  if (type == "default") return;
  if (type == "linear")
    c.rope_scaling = layers::RopeScaling::linear;
  else if (type == "llama3")
    c.rope_scaling = layers::RopeScaling::llama3;
  else if (type == "yarn")
    c.rope_scaling = layers::RopeScaling::yarn;
  else
    throw UserError("'" + source + "': " + key + ".rope_type '" + type +
                    "' is not supported (default, linear, llama3, yarn)");
  auto number = [&](const char* name, double fallback, const char* retort_key) {
    const double value = fallback < 0 ? get_key<double>(rope, name, source)
                                      : get_or<double>(rope, name, fallback, source);
    check_in_range(value, key + "." + name, retort_key, source);
    return value;
  };
  c.rope_factor = number("factor", -1, "model.rope_factor");
  if (c.rope_scaling == layers::RopeScaling::linear) return;
  // The context it was pretrained for: Phi-3 keeps it at the top level, which wins; else the
  // settings', else max_position_embeddings (transformers' order).
  int64_t original = get_or<int64_t>(j, "original_max_position_embeddings", 0, source);
  if (original == 0)
    original = get_or<int64_t>(rope, "original_max_position_embeddings", 0, source);
  if (original == 0) original = get_key<int64_t>(j, "max_position_embeddings", source);
  check_in_range(double(original), "original_max_position_embeddings",
                 "model.rope_original_context", source);
  c.rope_original_context = original;
  if (c.rope_scaling == layers::RopeScaling::llama3) {
    c.rope_low_freq_factor = number("low_freq_factor", -1, "model.rope_low_freq_factor");
    c.rope_high_freq_factor = number("high_freq_factor", -1, "model.rope_high_freq_factor");
    return;
  }
  for (const char* unsupported : {"mscale", "mscale_all_dim"})
    if (get_or<double>(rope, unsupported, 0.0, source) != 0)
      throw UserError("'" + source + "': " + key + "." + unsupported + " is not supported");
  if (!get_or<bool>(rope, "truncate", true, source))
    throw UserError("'" + source + "': " + key + ".truncate=false is not supported");
  c.rope_attention_factor = number("attention_factor", 0.0, "model.rope_attention_factor");
  // transformers reads a zero beta as its default.
  c.rope_beta_fast = number("beta_fast", 32.0, "model.rope_beta_fast");
  if (c.rope_beta_fast == 0) c.rope_beta_fast = 32.0;
  c.rope_beta_slow = number("beta_slow", 1.0, "model.rope_beta_slow");
  if (c.rope_beta_slow == 0) c.rope_beta_slow = 1.0;
}

// c's RoPE settings as transformers 5's rope_parameters.
nlohmann::json rope_parameters_of(const layers::ModelConfig& c) {
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  if (c.rope_scaling == layers::RopeScaling::none) return rope;
  rope["rope_type"] = enum_name(c.rope_scaling);
  rope["factor"] = c.rope_factor;
  if (c.rope_scaling == layers::RopeScaling::linear) return rope;
  rope["original_max_position_embeddings"] = c.rope_original_context;
  if (c.rope_scaling == layers::RopeScaling::llama3) {
    rope["low_freq_factor"] = c.rope_low_freq_factor;
    rope["high_freq_factor"] = c.rope_high_freq_factor;
    return rope;
  }
  rope["beta_fast"] = c.rope_beta_fast;
  rope["beta_slow"] = c.rope_beta_slow;
  if (c.rope_attention_factor > 0) rope["attention_factor"] = c.rope_attention_factor;
  return rope;
}

}  // namespace

layers::ModelConfig read_hf_config(const std::string& dir) {
  const std::string source = (fs::path(dir) / "config.json").string();
  const nlohmann::json j = read_json(source);
  const std::string type = get_key<std::string>(j, "model_type", source);
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3" && type != "phi3")
    throw UserError("'" + source + "': model_type '" + type +
                    "' is not one Retort reads (llama, mistral, qwen2, qwen3, phi3)");
  const std::string act = get_or<std::string>(j, "hidden_act", "silu", source);
  if (act != "silu") throw UserError("'" + source + "': hidden_act '" + act + "' (only silu)");
  // RoPE's settings: transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; earlier
  // versions wrote rope_theta at the top level and rope_scaling {rope_type or type, ...}. Where
  // both are set rope_scaling wins, as in transformers 5.
  const nlohmann::json* rope = nullptr;
  std::string rope_key;
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (j.contains(key) && !j[key].is_null()) {
      if (!j[key].is_object()) throw UserError("'" + source + "': " + key + " is not an object");
      rope = &j[key];
      rope_key = key;
    }
  if (get_or<bool>(j, "mlp_bias", false, source))
    throw UserError("'" + source + "': mlp_bias is not supported");
  layers::ModelConfig c;
  c.vocab_size = get_key<int64_t>(j, "vocab_size", source);
  c.hidden = get_key<int64_t>(j, "hidden_size", source);
  c.layers = get_key<int64_t>(j, "num_hidden_layers", source);
  c.heads = get_key<int64_t>(j, "num_attention_heads", source);
  c.kv_heads = get_or<int64_t>(j, "num_key_value_heads", c.heads, source);
  c.ffn_hidden = get_key<int64_t>(j, "intermediate_size", source);
  c.rope_theta = get_or<double>(j, "rope_theta", 10000.0, source);
  if (get_or<double>(j, "partial_rotary_factor", 1.0, source) != 1.0)
    throw UserError("'" + source +
                    "': partial_rotary_factor (RoPE on part of each head) is not "
                    "supported");
  if (rope) read_rope_scaling(*rope, rope_key, j, source, c);
  c.norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
  c.tied_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
  for (const auto& [hf_key, value, retort_key] :
       std::initializer_list<std::tuple<const char*, double, const char*>>{
           {"vocab_size", double(c.vocab_size), "model.vocab_size"},
           {"hidden_size", double(c.hidden), "model.hidden"},
           {"num_hidden_layers", double(c.layers), "model.layers"},
           {"num_attention_heads", double(c.heads), "model.heads"},
           {"num_key_value_heads", double(c.kv_heads), "model.kv_heads"},
           {"intermediate_size", double(c.ffn_hidden), "model.ffn_hidden"},
           {"rope_theta", c.rope_theta, "model.rope_theta"},
           {"rms_norm_eps", c.norm_eps, "model.norm_eps"}})
    check_in_range(value, hf_key, retort_key, source);
  if (c.heads <= 0) throw UserError("'" + source + "': num_attention_heads must be positive");
  // head_dim: its own where the config sets one (Qwen3, Mistral-Nemo), else hidden / heads
  // (transformers' rule; a null head_dim reads as absent).
  const bool own_head_dim = j.contains("head_dim") && !j["head_dim"].is_null();
  if (own_head_dim) {
    c.explicit_head_dim = get_key<int64_t>(j, "head_dim", source);
    check_in_range(double(c.explicit_head_dim), "head_dim", "model.head_dim", source);
    if (c.explicit_head_dim < 1) throw UserError("'" + source + "': head_dim must be positive");
    if (c.explicit_head_dim == c.hidden / c.heads && c.hidden % c.heads == 0)
      c.explicit_head_dim = 0;  // the default, kept implicit
  } else if (c.hidden % c.heads != 0) {
    throw UserError("'" + source +
                    "': hidden_size is not a multiple of num_attention_heads and there is no "
                    "head_dim");
  }
  if (c.kv_heads <= 0 || c.heads % c.kv_heads != 0)
    throw UserError("'" + source + "': num_key_value_heads does not divide num_attention_heads");
  if (type == "qwen3") c.qk_norm = true;  // per-head RMSNorm of q and k before RoPE
  if (type == "qwen2" || type == "qwen3") {
    if (type == "qwen2") c.qkv_bias = true;  // Qwen2 biases q, k and v (not o)
    if (type == "qwen3" && get_or<bool>(j, "attention_bias", false, source))
      throw UserError("'" + source + "': attention_bias also biases o_proj, which Retort lacks");
    if (get_or<bool>(j, "use_sliding_window", false, source))
      throw UserError("'" + source +
                      "': use_sliding_window (Qwen2's per-layer windows) is "
                      "not supported");
  } else if (get_or<bool>(j, "attention_bias", false, source)) {
    throw UserError("'" + source + "': attention_bias also biases o_proj, which Retort lacks");
  }
  if (type == "mistral" || type == "phi3")  // Phi-3-mini's attention has a window too
    c.sliding_window = get_or<int64_t>(j, "sliding_window", 0, source);
  return c;
}

std::string hf_config_json(const layers::ModelConfig& c, const std::string& weights_dtype,
                           const std::string& model_type) {
  if (!c.layer_windows.empty())
    throw UserError("model.layer_windows: per-layer windows have no Hugging Face Llama config");
  if (!model_type.empty() && model_type != "phi3")
    throw UserError("--model-type '" + model_type +
                    "': only phi3 is asked for (the others follow from the model)");
  if (model_type == "phi3" && (c.qkv_bias || c.qk_norm))
    throw UserError("--model-type phi3: Phi-3 has no qkv bias and no q/k norms");
  nlohmann::json j;
  const std::string type = !model_type.empty()    ? model_type
                           : c.qk_norm            ? "qwen3"
                           : c.qkv_bias           ? "qwen2"
                           : c.sliding_window > 0 ? "mistral"
                                                  : "llama";
  if ((c.qkv_bias || c.qk_norm) && c.sliding_window > 0)
    throw UserError(
        "model.sliding_window with model.qkv_bias or model.qk_norm has no Hugging "
        "Face config");
  if (c.qkv_bias && c.qk_norm)
    throw UserError("model.qkv_bias with model.qk_norm has no Hugging Face config");
  static const std::map<std::string, std::string> arch = {{"llama", "LlamaForCausalLM"},
                                                          {"mistral", "MistralForCausalLM"},
                                                          {"qwen2", "Qwen2ForCausalLM"},
                                                          {"qwen3", "Qwen3ForCausalLM"},
                                                          {"phi3", "Phi3ForCausalLM"}};
  j["architectures"] = {arch.at(type)};
  j["model_type"] = type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim();  // transformers reads it for Llama, Mistral and Qwen2
  j["intermediate_size"] = c.ffn_hidden;
  j["rope_theta"] = c.rope_theta;                     // read by transformers 4
  j["rope_parameters"] = rope_parameters_of(c);       // and 5
  if (c.rope_scaling != layers::RopeScaling::none) {  // transformers 4 reads rope_scaling
    j["rope_scaling"] = rope_parameters_of(c);
    j["rope_scaling"].erase("rope_theta");
  }
  j["rms_norm_eps"] = c.norm_eps;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = "silu";
  // The weights' own type, so torch_dtype="auto" loads them as they are stored.
  j["torch_dtype"] = weights_dtype;  // transformers 4's name
  j["dtype"] = weights_dtype;        // transformers 5's
  if (type == "llama" || type == "qwen3") j["attention_bias"] = false;
  if (type == "mistral" || (type == "phi3" && c.sliding_window > 0))
    j["sliding_window"] = c.sliding_window;
  // Phi3Config's default pad id (32000) is an embedding row it marks; Retort keeps none.
  if (type == "phi3") j["pad_token_id"] = nullptr;
  return j.dump(2) + "\n";
}

std::optional<std::string> hf_name(const std::string& ours) {
  static const std::map<std::string, std::string> top = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"final_norm.weight", "model.norm.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  if (auto it = top.find(ours); it != top.end()) return it->second;
  static const std::regex layer(R"(layers\.(\d+)\.(.+))");
  static const std::map<std::string, std::string> inner = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"mlp_norm.weight", "post_attention_layernorm.weight"}};
  std::smatch m;
  if (!std::regex_match(ours, m, layer)) return std::nullopt;
  const std::string prefix = "model.layers." + m[1].str() + ".", rest = m[2].str();
  if (auto it = inner.find(rest); it != inner.end()) return prefix + it->second;
  if (rest.rfind("attn.", 0) == 0) return prefix + "self_attn." + rest.substr(5);
  if (rest.rfind("mlp.", 0) == 0) return prefix + rest;
  return std::nullopt;
}

HfWeights::HfWeights(const std::string& dir) : dir_(dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::is_regular_file(index)) {
    const nlohmann::json j = read_json(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw UserError("'" + index.string() + "': no weight_map object");
    std::set<std::string> unique;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw UserError("'" + index.string() + "': weight_map entry '" + it.key() +
                        "' is not a file name");
      const std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos || file == "..")
        throw UserError("'" + index.string() + "': file '" + file + "' is not in the directory");
      unique.insert(file);
    }
    files.assign(unique.begin(), unique.end());
  } else if (fs::is_regular_file(single)) {
    files.push_back("model.safetensors");
  } else {
    throw UserError("'" + dir + "': neither model.safetensors nor model.safetensors.index.json");
  }
  for (const std::string& file : files) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / file).string()));
    for (const StTensor& t : files_.back()->header().tensors) {
      if (file_of_.count(t.name))
        throw UserError("'" + dir + "': tensor '" + t.name + "' is in two files");
      file_of_[t.name] = files_.size() - 1;
    }
  }
}

const StTensor* HfWeights::find(const std::string& name) const {
  auto it = file_of_.find(name);
  return it == file_of_.end() ? nullptr : files_[it->second]->find(name);
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : file_of_) out.push_back(name);
  return out;
}

torch::Tensor HfWeights::read(const std::string& name, torch::ScalarType dtype) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw UserError("'" + dir_ + "': tensor '" + name + "' is missing");
  const SafetensorsFile& file = *files_[it->second];
  const StTensor& t = *file.find(name);
  const torch::ScalarType stored = torch_dtype(t.dtype);
  if (stored == torch::kByte)
    throw UserError("'" + file.path() + "': tensor '" + name + "' has dtype " +
                    dtype_name(t.dtype) + ", not a floating-point weight");
  // Copied out of the mapping (its bytes need not be aligned for the dtype), then converted.
  torch::Tensor raw = torch::empty(t.shape, torch::dtype(stored));
  std::memcpy(raw.data_ptr(), file.bytes(t), t.end - t.begin);
  return raw.to(dtype);
}

namespace {

// The Hugging Face names of every weight of a model of this shape (all layers, whichever
// stage is loading).
std::set<std::string> model_hf_names(const layers::ModelConfig& c, bool phi3) {
  std::set<std::string> names = {"model.embed_tokens.weight", "model.norm.weight"};
  if (!c.tied_embeddings) names.insert("lm_head.weight");
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n :
         {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      names.insert(p + n);
    if (c.qkv_bias)
      for (const char* n :
           {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"})
        names.insert(p + n);
    if (c.qk_norm)
      for (const char* n : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
        names.insert(p + n);
  }
  if (!phi3) return names;
  std::set<std::string> fused;  // Phi-3's: q, k, v and gate, up as one tensor each
  for (const std::string& name : names) {
    const std::optional<FusedRows> rows = phi3_rows(name, c);
    fused.insert(rows ? rows->tensor : name);
  }
  return fused;
}

}  // namespace

void load_hf_parameters(const std::string& dir, const layers::ModelConfig& config,
                        layers::ParameterStore& store, const layers::TensorParallel& tp) {
  const HfWeights weights(dir);
  const bool phi3 = read_hf_model_type(dir) == "phi3";
  // Strict both ways: a tensor this model has no place for means the wrong model or config.
  // Old exports carry RoPE's inv_freq buffers, and tied models sometimes a copy of the head.
  const std::set<std::string> expected = model_hf_names(config, phi3);
  for (const std::string& name : weights.names()) {
    const bool ignorable = name.find("rotary_emb.inv_freq") != std::string::npos ||
                           (config.tied_embeddings && name == "lm_head.weight");
    if (!expected.count(name) && !ignorable)
      throw UserError("'" + dir + "': tensor '" + name + "' has no place in this model");
  }
  torch::NoGradGuard no_grad;
  for (layers::Parameter& p : store.all()) {
    // A tied head (and a pipeline stage's tied copy) is the embedding.
    const std::string ours = p.spec.tied_copy ? "embed.weight" : p.spec.name;
    const std::optional<std::string> name = hf_name(ours);
    if (!name) continue;  // not a model weight (a distillation projection)
    // Phi-3: its rows of a fused tensor.
    const std::optional<FusedRows> rows = phi3 ? phi3_rows(*name, config) : std::nullopt;
    const std::string stored = rows ? rows->tensor : *name;
    const StTensor* entry = weights.find(stored);
    if (!entry && ours == "lm_head.weight" && config.tied_embeddings)
      throw UserError("'" + dir +
                      "': tensor 'lm_head.weight' is missing: that model ties its "
                      "head to the embedding (tie_word_embeddings), this one does not (set "
                      "model.tied_embeddings: true)");
    if (!entry)
      throw UserError("'" + dir + "': tensor '" + stored + "' (our " + ours + ") is missing");
    std::vector<int64_t> shape = entry->shape;
    if (rows && !shape.empty()) {  // the fused tensor must hold exactly its parts' rows
      const int64_t total = rows->tensor.find("qkv") != std::string::npos
                                ? (config.heads + 2 * config.kv_heads) * config.head_dim()
                                : 2 * config.ffn_hidden;
      shape[0] = shape[0] == total ? rows->rows : -1;
    }
    if (shape != p.spec.shape) {
      std::string want, got;
      for (int64_t d : p.spec.shape) want += (want.empty() ? "" : ",") + std::to_string(d);
      for (int64_t d : entry->shape) got += (got.empty() ? "" : ",") + std::to_string(d);
      throw UserError("'" + dir + "': tensor '" + stored + "' has shape [" + got +
                      "], the model needs [" + want + "]" + (rows ? " as its rows of it" : ""));
    }
    torch::Tensor global = weights.read(stored, p.value.scalar_type());
    if (rows) global = global.narrow(0, rows->first_row, rows->rows).contiguous();
    p.value.copy_(layers::from_global(global, p.spec, tp, p.value));
  }
}

}  // namespace retort::hf
