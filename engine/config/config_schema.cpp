// engine/config/config_schema.cpp: the key table, expanded from the key lists of the config
// structs (each list sits next to the code that uses its keys). A new key is one entry in one
// list plus its use; nothing here changes.
#include "engine/config/config_schema.h"

#include <cmath>
#include <sstream>
#include <type_traits>

#include "engine/config/config.h"
#include "engine/config/train_config.h"

namespace retort::engine {
namespace {

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

template <typename T>
constexpr KeyType key_type() {
  if constexpr (std::is_same_v<T, bool>)
    return KeyType::Bool;
  else if constexpr (std::is_same_v<T, IntOrAuto>)
    return KeyType::IntOrAuto;
  else if constexpr (std::is_integral_v<T>)
    return KeyType::Int;
  else if constexpr (std::is_floating_point_v<T>)
    return KeyType::Float;
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
    return KeyType::IntList;
  else if constexpr (std::is_same_v<T, std::vector<double>>)
    return KeyType::FloatList;
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return KeyType::StringList;
  else
    return KeyType::String;  // strings and enums
}

template <typename T>
std::string yaml_of(const T& value) {
  std::ostringstream out;
  out.precision(15);
  if constexpr (std::is_same_v<T, bool>)
    out << (value ? "true" : "false");
  else if constexpr (std::is_same_v<T, IntOrAuto>) {
    if (value.value == 0)
      out << "auto";
    else
      out << value.value;
  } else if constexpr (std::is_enum_v<T>)
    out << enum_name(value);
  else if constexpr (std::is_same_v<T, std::string>)
    out << '"' << value << '"';
  else if constexpr (IsVector<T>::value) {
    out << "[";
    for (size_t i = 0; i < value.size(); ++i) out << (i ? ", " : "") << yaml_of(value[i]);
    out << "]";
  } else
    out << value;
  return out.str();
}

template <typename T>
T value_of(const Config& c, const std::string& path) {
  if constexpr (std::is_same_v<T, bool>)
    return c.get_bool(path);
  else if constexpr (std::is_same_v<T, IntOrAuto>)
    return IntOrAuto{c.get_int(path)};
  else if constexpr (std::is_integral_v<T>)
    return static_cast<T>(c.get_int(path));
  else if constexpr (std::is_floating_point_v<T>)
    return c.get_float(path);
  else if constexpr (std::is_enum_v<T>) {
    const std::vector<std::string>& names = enum_names(T{});
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == c.get_string(path)) return static_cast<T>(i);
    throw std::logic_error(path + ": '" + c.get_string(path) + "' passed validation");
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
    return c.get_int_list(path);
  else if constexpr (std::is_same_v<T, std::vector<double>>)
    return c.get_float_list(path);
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return c.get_string_list(path);
  else
    return c.get_string(path);
}

// One table row: `member` returns where the value goes in a TrainConfig.
template <typename T, typename Member>
KeySpec spec(const char* path, const T& default_value, double min, double max, const char* help,
             Member member) {
  KeySpec k;
  k.path = path;
  k.type = key_type<T>();
  k.default_yaml = yaml_of(default_value);
  constexpr bool numeric =
      (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) || std::is_same_v<T, IntOrAuto> ||
      std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>;
  if (numeric) {
    k.min = min;
    k.max = max >= kUnbounded ? std::numeric_limits<double>::infinity() : max;
  }
  if constexpr (std::is_enum_v<T>) k.choices = enum_names(T{});
  k.help = help;
  const std::string key = path;
  k.assign = [key, member](const Config& c, TrainConfig& t) { member(t) = value_of<T>(c, key); };
  return k;
}

// KEY(type, member, path, default, min, max, help) of a list whose struct sits at `at` in a
// TrainConfig (`at` ends with a dot, or is empty for TrainConfig's own keys).
#define RETORT_SPEC(at, type, member, path, default_value, min, max, help) \
  spec<type>(path, type(default_value), min, max, help,                    \
             [](TrainConfig& t) -> type& { return t.at member; }),
#define RETORT_SPEC_RUN(...) RETORT_SPEC(, __VA_ARGS__)
#define RETORT_SPEC_MODEL(...) RETORT_SPEC(model., __VA_ARGS__)
#define RETORT_SPEC_PARAMS(...) RETORT_SPEC(params., __VA_ARGS__)
#define RETORT_SPEC_TEACHER(...) RETORT_SPEC(distill.keys., __VA_ARGS__)
#define RETORT_SPEC_DISTILL(...) RETORT_SPEC(distill.objective., __VA_ARGS__)
#define RETORT_SPEC_LOGITS(...) RETORT_SPEC(distill.objective.logits., __VA_ARGS__)
#define RETORT_SPEC_DATA(...) RETORT_SPEC(data., __VA_ARGS__)
#define RETORT_SPEC_TRAINING(...) RETORT_SPEC(training., __VA_ARGS__)
#define RETORT_SPEC_SCHEDULE(...) RETORT_SPEC(optimizer.schedule., __VA_ARGS__)
#define RETORT_SPEC_OPTIMIZER(...) RETORT_SPEC(optimizer., __VA_ARGS__)
#define RETORT_SPEC_CHECKPOINT(...) RETORT_SPEC(checkpoint., __VA_ARGS__)
#define RETORT_SPEC_PARALLEL(...) RETORT_SPEC(parallel., __VA_ARGS__)
#define RETORT_SPEC_RUNTIME(...) RETORT_SPEC(runtime., __VA_ARGS__)
#define RETORT_SPEC_MEMORY(...) RETORT_SPEC(memory., __VA_ARGS__)
#define RETORT_SPEC_LOGGING(...) RETORT_SPEC(logging., __VA_ARGS__)

std::vector<KeySpec> build_keys() {
  using distill::ActivationLoss;
  using distill::LogitLoss;
  using distill::TopKTail;
  using layers::Checkpointing;
  using layers::RopeScaling;
  return {RETORT_RUN_KEYS(RETORT_SPEC_RUN) RETORT_MODEL_KEYS(RETORT_SPEC_MODEL)
              RETORT_PARAM_POLICY_KEYS(RETORT_SPEC_PARAMS) RETORT_TEACHER_KEYS(RETORT_SPEC_TEACHER)
                  RETORT_DISTILL_KEYS(RETORT_SPEC_DISTILL)
                      RETORT_LOGIT_LOSS_KEYS(RETORT_SPEC_LOGITS) RETORT_DATA_KEYS(RETORT_SPEC_DATA)
                          RETORT_TRAINING_KEYS(RETORT_SPEC_TRAINING)
                              RETORT_LR_SCHEDULE_KEYS(RETORT_SPEC_SCHEDULE)
                                  RETORT_OPTIMIZER_KEYS(RETORT_SPEC_OPTIMIZER)
                                      RETORT_CHECKPOINT_KEYS(RETORT_SPEC_CHECKPOINT)
                                          RETORT_PARALLEL_KEYS(RETORT_SPEC_PARALLEL)
                                              RETORT_MEMORY_KEYS(RETORT_SPEC_MEMORY)
                                                  RETORT_RUNTIME_KEYS(RETORT_SPEC_RUNTIME)
                                                      RETORT_LOGGING_KEYS(RETORT_SPEC_LOGGING)};
}

}  // namespace

const std::vector<KeySpec>& config_keys() {
  static const std::vector<KeySpec> keys = build_keys();
  return keys;
}

const KeySpec* find_key(const std::string& path) {
  for (const KeySpec& k : config_keys())
    if (k.path == path) return &k;
  return nullptr;
}

std::string keys_help() {
  std::ostringstream out;
  for (const KeySpec& k : config_keys()) {
    out << "  " << k.path << " (" << type_name(k.type) << ", default " << k.default_yaml;
    if (!k.choices.empty()) {
      out << "; one of";
      for (const std::string& c : k.choices) out << " " << c;
    } else if (std::isfinite(k.min) || std::isfinite(k.max)) {
      out << "; range [" << k.min << ", " << k.max << "]";
    }
    out << ")\n      " << k.help << "\n";
  }
  return out.str();
}

std::string type_name(KeyType type) {
  switch (type) {
    case KeyType::Int:
      return "an integer";
    case KeyType::IntOrAuto:
      return "an integer or 'auto'";
    case KeyType::Float:
      return "a number";
    case KeyType::Bool:
      return "true or false";
    case KeyType::String:
      return "a string";
    case KeyType::IntList:
      return "a list of integers";
    case KeyType::FloatList:
      return "a list of numbers";
    case KeyType::StringList:
      return "a list of strings";
  }
  return "?";
}

}  // namespace retort::engine
