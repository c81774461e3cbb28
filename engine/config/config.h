// engine/config/config.h: a run's configuration: a YAML file plus dotted key=value overrides,
// checked strictly against the key table (config_schema.h). Unknown keys get a
// did-you-mean suggestion; a wrong type or out-of-range value names the key path and where
// it came from (file:line or the override). No torch here.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace retort::engine {

using ConfigValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                                 std::vector<double>, std::vector<std::string>>;

class Config {
 public:
  // Every key at its default.
  Config();
  // Reads the YAML file (if path is non-empty) then applies overrides in order.
  static Config load(const std::string& yaml_path, const std::vector<std::string>& overrides);
  // Parses YAML text; `source` names it in messages.
  void merge_yaml_text(const std::string& text, const std::string& source);
  void apply_override(const std::string& assignment);

  int64_t get_int(const std::string& path) const;
  double get_float(const std::string& path) const;
  bool get_bool(const std::string& path) const;
  const std::string& get_string(const std::string& path) const;
  const std::vector<int64_t>& get_int_list(const std::string& path) const;
  const std::vector<double>& get_float_list(const std::string& path) const;
  const std::vector<std::string>& get_string_list(const std::string& path) const;
  // Where a key's value came from: "default", "file.yaml:12" or "override 'k=v'".
  const std::string& origin(const std::string& path) const;

  // The resolved configuration as YAML, every key included.
  std::string to_yaml() const;

 private:
  struct Entry {
    ConfigValue value;
    std::string origin;
  };
  const Entry& entry(const std::string& path) const;
  std::map<std::string, Entry> entries_;
};

// The closest known key to `path`, or "" when nothing is close.
std::string suggest_key(const std::string& path);

}  // namespace retort::engine
