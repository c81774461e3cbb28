// common/user_error.h: the error type for bad input (config, files, layouts, command line).
// Programs catch it at main, print its one-line message and exit non-zero; anything else
// escaping is a bug in Retort, not in the user's input.
#pragma once
#include <stdexcept>
#include <string>

namespace retort {

struct UserError : std::runtime_error {
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace retort
