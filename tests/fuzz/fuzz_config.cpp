// tests/fuzz/fuzz_config.cpp: libFuzzer target for the YAML config loader, the key=value
// overrides and the typed config's cross-key checks. The input is YAML text, optionally
// followed by a line "#overrides" and one override per line; the first byte also picks the
// world size (1..8). Bad input must end in UserError; anything else escaping, a crash or a
// sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "common/user_error.h"
#include "engine/config/config.h"
#include "engine/config/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const int world_size = size > 0 ? 1 + data[0] % 8 : 1;
  const size_t split = input.find("\n#overrides\n");
  const std::string yaml = input.substr(0, split);
  try {
    retort::engine::Config config;
    config.merge_yaml_text(yaml, "fuzz.yaml");
    if (split != std::string::npos) {
      std::istringstream lines(input.substr(split + 12));
      std::string line;
      while (std::getline(lines, line)) config.apply_override(line);
    }
    retort::engine::make_train_config(config, world_size);
    (void)config.to_yaml();
  } catch (const retort::UserError&) {
  }
  return 0;
}
