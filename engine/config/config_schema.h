// engine/config/config_schema.h: the key table: every configuration key Retort knows, with
// its type, default, allowed range or choices, one-line help and where its value goes in a
// TrainConfig. Built from the key lists of the config structs (key_table.h); the loader
// refuses anything not listed. No torch here.
#pragma once
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace retort::engine {

class Config;
struct TrainConfig;

enum class KeyType { Int, IntOrAuto, Float, Bool, String, IntList, FloatList, StringList };

struct KeySpec {
  std::string path;  // dotted, e.g. "training.steps"
  KeyType type;
  std::string default_yaml;  // default value written as YAML
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // for enums; empty = any
  std::string help;
  // Stores the key's (validated) value from `config` into its member of `into`.
  std::function<void(const Config& config, TrainConfig& into)> assign;
};

const std::vector<KeySpec>& config_keys();
const KeySpec* find_key(const std::string& path);
std::string type_name(KeyType type);
// Every key, one per line: path, type, default, range or choices, help (for --help).
std::string keys_help();

}  // namespace retort::engine
