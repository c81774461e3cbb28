// common/make_directories.h: creates an output folder (and its parents), or stops with one
// line naming the folder and the reason, instead of an uncaught std::filesystem_error; and
// says why writes under a folder fail, for errors from libraries (HDF5) that do not.
#pragma once
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

// Why writing under `folder` fails, as the end of an error message: ": no space left on its
// file system (N bytes free)", ": the folder is not writable (read-only ...)", else the last
// system error, else "".
inline std::string why_writes_fail(const std::string& folder, int saved_errno = errno) {
  std::error_code error;
  const std::filesystem::space_info space = std::filesystem::space(folder, error);
  if (!error && space.available < (1u << 20))
    return ": no space left on its file system (" + std::to_string(space.available) +
           " bytes free)";
  if (::access(folder.c_str(), W_OK) != 0)
    return ": the folder is not writable (" + std::string(std::strerror(errno)) + ")";
  if (saved_errno != 0) return ": " + std::string(std::strerror(saved_errno));
  return "";
}

}  // namespace retort
