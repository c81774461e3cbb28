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

// A run that cannot go on, decided by all ranks together (e.g. too many non-finite steps, or
// bad input all ranks agreed on): every rank throws it at the same point, so main ends with its
// message and exit_code (1: the run stopped; 2: bad input) without aborting the others, and
// nothing already saved is touched.
struct AgreedStop : UserError {
  explicit AgreedStop(const std::string& message, int exit_code = 1)
      : UserError(message), exit_code(exit_code) {}
  int exit_code;
};

}  // namespace retort
