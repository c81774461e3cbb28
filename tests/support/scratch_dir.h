// tests/support/scratch_dir.h: a test's own temporary folder. scratch_dir(name) makes a new,
// unique folder (mkdtemp: <tmp>/retort_<name>_XXXXXX) and removes it, with everything in it,
// when the test process exits, so a suite run leaves nothing in the temporary directory and
// tests running side by side never share one. shared_scratch_dir (tests/support/
// shared_scratch_dir.h) is the MPI form.
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace retort::testing {

namespace detail {
// Removes its folder when destroyed: the registry below lives until the process exits.
struct RemovedAtExit {
  explicit RemovedAtExit(std::string folder) : path(std::move(folder)) {}
  RemovedAtExit(const RemovedAtExit&) = delete;  // one owner: a copy's end would remove it early
  RemovedAtExit& operator=(const RemovedAtExit&) = delete;
  std::string path;
  ~RemovedAtExit() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};
inline std::vector<std::unique_ptr<RemovedAtExit>>& folders_to_remove() {
  static std::vector<std::unique_ptr<RemovedAtExit>> folders;
  return folders;
}
}  // namespace detail

// Makes the folder and registers it for removal at exit; returns its path.
inline std::string scratch_dir(const std::string& name) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("retort_" + name + "_XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  detail::folders_to_remove().push_back(std::make_unique<detail::RemovedAtExit>(pattern));
  return pattern;
}

}  // namespace retort::testing
