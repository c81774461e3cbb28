// engine/config_schema.h: every configuration key Retort knows, with its type, default,
// allowed range or choices and a one-line help. The loader refuses anything not listed here.
#pragma once
#include <limits>
#include <string>
#include <vector>

namespace retort::engine {

enum class KeyType { Int, IntOrAuto, Float, Bool, String, IntList, FloatList, StringList };

struct KeySpec {
  std::string path;           // dotted, e.g. "training.steps"
  KeyType type;
  std::string default_yaml;   // default value written as YAML
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // for strings; empty = any
  std::string help;
};

const std::vector<KeySpec>& config_keys();
const KeySpec* find_key(const std::string& path);
std::string type_name(KeyType type);

}  // namespace retort::engine
