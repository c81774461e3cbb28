// common/named_enum.h: RETORT_NAMED_ENUM(Name, a, b, c) declares `enum class Name { a, b, c }`
// and `enum_names(Name)`, the enumerators' spellings in order, so config keys parse enums at
// the boundary and messages list the choices. No torch here.
#pragma once
#include <string>
#include <vector>

namespace retort {

// "a, b, c" -> {"a", "b", "c"}
inline std::vector<std::string> split_enumerators(const std::string& list) {
  std::vector<std::string> names(1);
  for (char ch : list) {
    if (ch == ',')
      names.emplace_back();
    else if (ch != ' ')
      names.back() += ch;
  }
  return names;
}

}  // namespace retort

#define RETORT_NAMED_ENUM(Name, ...)                                                       \
  enum class Name { __VA_ARGS__ };                                                         \
  inline const std::vector<std::string>& enum_names(Name) {                                \
    static const std::vector<std::string> names = retort::split_enumerators(#__VA_ARGS__); \
    return names;                                                                          \
  }                                                                                        \
  inline const std::string& enum_name(Name value) {                                        \
    return enum_names(value)[int(value)];                                                  \
  }
