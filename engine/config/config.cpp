// engine/config/config.cpp: see config.h.
#include "engine/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/user_error.h"
#include "engine/config/config_schema.h"

namespace retort::engine {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool is_section(const std::string& path) {
  for (const KeySpec& k : config_keys())
    if (k.path.rfind(path + ".", 0) == 0) return true;
  return false;
}

std::string unknown_key_message(const std::string& where, const std::string& path) {
  std::string message = where + ": unknown config key '" + path + "'";
  std::string suggestion = suggest_key(path);
  if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
  return message;
}

bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_float(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parse_bool(const std::string& text, bool* out) {
  if (text == "true" || text == "True" || text == "yes" || text == "on") return *out = true, true;
  if (text == "false" || text == "False" || text == "no" || text == "off")
    return *out = false, true;
  return false;
}

std::string describe_node(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

void check_range(const KeySpec& key, double v, const std::string& where) {
  if (v < key.min || v > key.max) {
    std::ostringstream os;
    os << where << ": " << key.path << " = " << v << " is out of range [" << key.min << ", "
       << key.max << "]";
    throw UserError(os.str());
  }
}

// Converts a YAML node to the key's type; `where` prefixes every message.
ConfigValue convert(const KeySpec& key, const YAML::Node& node, const std::string& where) {
  auto wrong = [&]() {
    return UserError(where + ": " + key.path + " expects " + type_name(key.type) + ", got " +
                     describe_node(node));
  };
  auto scalar_int = [&](const YAML::Node& n) {
    int64_t v;
    if (!n.IsScalar() || !parse_int(n.Scalar(), &v)) throw wrong();
    check_range(key, double(v), where);
    return v;
  };
  auto scalar_float = [&](const YAML::Node& n) {
    double v;
    if (!n.IsScalar() || !parse_float(n.Scalar(), &v)) throw wrong();
    check_range(key, v, where);
    return v;
  };
  switch (key.type) {
    case KeyType::Int:
      return scalar_int(node);
    case KeyType::IntOrAuto:
      if (node.IsScalar() && node.Scalar() == "auto") return int64_t{0};
      return scalar_int(node);
    case KeyType::Float:
      return scalar_float(node);
    case KeyType::Bool: {
      bool v;
      if (!node.IsScalar() || !parse_bool(node.Scalar(), &v)) throw wrong();
      return v;
    }
    case KeyType::String: {
      if (!node.IsNull() && !node.IsScalar()) throw wrong();
      const std::string v = node.IsNull() ? std::string() : node.Scalar();
      // A choice key left empty (`schedule:` or `schedule: #cosine`) is refused like any other
      // value outside its choices.
      if (!key.choices.empty() &&
          std::find(key.choices.begin(), key.choices.end(), v) == key.choices.end()) {
        std::string list;
        for (const auto& c : key.choices) list += (list.empty() ? "" : ", ") + c;
        throw UserError(where + ": " + key.path + " = '" + v + "' is not one of: " + list);
      }
      return v;
    }
    case KeyType::IntList:
    case KeyType::FloatList:
    case KeyType::StringList: {
      if (!node.IsSequence() && !node.IsNull()) throw wrong();
      std::vector<int64_t> ints;
      std::vector<double> floats;
      std::vector<std::string> strings;
      if (node.IsSequence()) {
        for (const YAML::Node& item : node) {
          if (key.type == KeyType::IntList) ints.push_back(scalar_int(item));
          if (key.type == KeyType::FloatList) floats.push_back(scalar_float(item));
          if (key.type == KeyType::StringList) {
            if (!item.IsScalar()) throw wrong();
            strings.push_back(item.Scalar());
          }
        }
      }
      if (key.type == KeyType::IntList) return ints;
      if (key.type == KeyType::FloatList) return floats;
      return strings;
    }
  }
  throw wrong();
}

void emit_value(YAML::Emitter& out, const ConfigValue& value) {
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::vector<int64_t>> ||
                      std::is_same_v<V, std::vector<double>> ||
                      std::is_same_v<V, std::vector<std::string>>) {
          out << YAML::Flow << YAML::BeginSeq;
          for (const auto& item : v) out << item;
          out << YAML::EndSeq;
        } else if constexpr (std::is_same_v<V, bool>) {
          out << (v ? "true" : "false");
        } else {
          out << v;
        }
      },
      value);
}

}  // namespace

std::string suggest_key(const std::string& path) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, path.size() / 3) + 1;
  auto consider = [&](const std::string& candidate) {
    size_t d = edit_distance(path, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  };
  for (const KeySpec& k : config_keys()) {
    consider(k.path);
    for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1))
      consider(k.path.substr(0, dot));  // sections, for a misspelt section name
    // Also match on the leaf name alone, for a key put under the wrong section.
    const std::string leaf = k.path.substr(k.path.rfind('.') + 1);
    const std::string given_leaf = path.substr(path.rfind('.') + 1);
    if (leaf == given_leaf && best.empty()) best = k.path, best_distance = 1;
  }
  return best;
}

Config::Config() {
  for (const KeySpec& k : config_keys())
    entries_[k.path] = {convert(k, YAML::Load(k.default_yaml), "default"), "default"};
}

Config Config::load(const std::string& yaml_path, const std::vector<std::string>& overrides) {
  Config config;
  if (!yaml_path.empty()) {
    std::ifstream in(yaml_path);
    if (!in) throw UserError("cannot open config file '" + yaml_path + "'");
    std::stringstream text;
    text << in.rdbuf();
    config.merge_yaml_text(text.str(), yaml_path);
  }
  for (const std::string& o : overrides) config.apply_override(o);
  return config;
}

void Config::merge_yaml_text(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UserError(source + ":" + std::to_string(e.mark.line + 1) +
                    ": YAML syntax error: " + e.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw UserError(source + ": the config must be a mapping of keys");
  // Walk the tree: a known leaf is converted, a known section recursed, anything else refused.
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& map,
                                                                        const std::string& prefix) {
    for (const auto& item : map) {
      const std::string name = item.first.Scalar();
      const std::string path = prefix.empty() ? name : prefix + "." + name;
      const std::string where = source + ":" + std::to_string(item.first.Mark().line + 1);
      if (const KeySpec* key = find_key(path)) {
        entries_[path] = {convert(*key, item.second, where), where};
      } else if (is_section(path)) {
        if (!item.second.IsMap())
          throw UserError(where + ": '" + path + "' is a section and needs nested keys");
        walk(item.second, path);
      } else {
        throw UserError(unknown_key_message(where, path));
      }
    }
  };
  walk(root, "");
}

void Config::apply_override(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const std::string where = "override '" + assignment + "'";
  if (eq == std::string::npos || eq == 0)
    throw UserError("malformed " + where + ": expected key=value, e.g. training.steps=100");
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  const KeySpec* key = find_key(path);
  if (!key) throw UserError(unknown_key_message(where, path));
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UserError("malformed " + where + ": " + e.msg);
  }
  // An empty value means an empty string or list, not YAML's null.
  if (text.empty()) node = YAML::Load("''");
  if (text.empty() && key->type >= KeyType::IntList) node = YAML::Load("[]");
  entries_[path] = {convert(*key, node, where), where};
}

const Config::Entry& Config::entry(const std::string& path) const {
  auto it = entries_.find(path);
  if (it == entries_.end()) throw std::logic_error("config key not in schema: " + path);
  return it->second;
}

int64_t Config::get_int(const std::string& p) const {
  return std::get<int64_t>(entry(p).value);
}
double Config::get_float(const std::string& p) const {
  return std::get<double>(entry(p).value);
}
bool Config::get_bool(const std::string& p) const {
  return std::get<bool>(entry(p).value);
}
const std::string& Config::get_string(const std::string& p) const {
  return std::get<std::string>(entry(p).value);
}
const std::vector<int64_t>& Config::get_int_list(const std::string& p) const {
  return std::get<std::vector<int64_t>>(entry(p).value);
}
const std::vector<double>& Config::get_float_list(const std::string& p) const {
  return std::get<std::vector<double>>(entry(p).value);
}
const std::vector<std::string>& Config::get_string_list(const std::string& p) const {
  return std::get<std::vector<std::string>>(entry(p).value);
}
const std::string& Config::origin(const std::string& p) const {
  return entry(p).origin;
}

std::string Config::to_yaml() const {
  // Group dotted keys into nested maps, in schema order.
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string open_section;
  for (const KeySpec& k : config_keys()) {
    const size_t dot = k.path.find('.');
    const std::string section = dot == std::string::npos ? "" : k.path.substr(0, dot);
    if (section != open_section) {
      if (!open_section.empty()) out << YAML::EndMap;
      if (!section.empty()) out << YAML::Key << section << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    out << YAML::Key << (dot == std::string::npos ? k.path : k.path.substr(dot + 1));
    out << YAML::Value;
    if (k.type == KeyType::IntOrAuto && get_int(k.path) == 0)
      out << "auto";
    else
      emit_value(out, entry(k.path).value);
  }
  if (!open_section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return out.c_str();
}

}  // namespace retort::engine
