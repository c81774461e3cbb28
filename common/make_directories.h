// common/make_directories.h: creates an output folder (and its parents), or stops with one
// line naming the folder and the reason, instead of an uncaught std::filesystem_error.
#pragma once
#include <filesystem>
#include <string>
#include <system_error>

#include "common/user_error.h"

namespace retort {

inline void make_directories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  // create_directories reports success on an existing folder; an existing file is an error.
  if (!error && !std::filesystem::is_directory(path, error))
    error = std::make_error_code(std::errc::not_a_directory);
  if (error) throw UserError("cannot create '" + path + "': " + error.message());
}

}  // namespace retort
