// engine/hf/hf_phi3.cpp: see hf_phi3.h.
#include "engine/hf/hf_phi3.h"

#include <regex>

namespace retort::hf {

std::optional<FusedRows> phi3_rows(const std::string& llama_name, const layers::ModelConfig& c) {
  static const std::regex part(
      R"((model\.layers\.\d+\.)(self_attn|mlp)\.(q|k|v|gate|up)_proj\.weight)");
  std::smatch m;
  if (!std::regex_match(llama_name, m, part)) return std::nullopt;
  const std::string prefix = m[1].str(), which = m[3].str();
  const int64_t q = c.heads * c.head_dim(), kv = c.kv_heads * c.head_dim(), f = c.ffn_hidden;
  if (which == "gate") return FusedRows{prefix + "mlp.gate_up_proj.weight", 0, f};
  if (which == "up") return FusedRows{prefix + "mlp.gate_up_proj.weight", f, f};
  const std::string qkv = prefix + "self_attn.qkv_proj.weight";
  if (which == "q") return FusedRows{qkv, 0, q};
  if (which == "k") return FusedRows{qkv, q, kv};
  return FusedRows{qkv, q + kv, kv};
}

std::vector<std::string> phi3_parts(const std::string& fused_name) {
  static const std::regex fused(
      R"((model\.layers\.\d+\.)(self_attn\.qkv|mlp\.gate_up)_proj\.weight)");
  std::smatch m;
  if (!std::regex_match(fused_name, m, fused)) return {};
  const std::string prefix = m[1].str();
  if (m[2].str() == "mlp.gate_up")
    return {prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"};
  return {prefix + "self_attn.q_proj.weight", prefix + "self_attn.k_proj.weight",
          prefix + "self_attn.v_proj.weight"};
}

}  // namespace retort::hf
