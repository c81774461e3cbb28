// tests/support/user_error_of.h: error_of(f), the message of the UserError f throws, or "" if
// it throws none: for tests that check a bad input's one line.
#pragma once
#include <string>

#include "common/user_error.h"

namespace retort::testing {

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace retort::testing
