// engine/train/run_folder.cpp: see run_folder.h.
#include "engine/train/run_folder.h"

#include <algorithm>
#include <filesystem>

#include "common/user_error.h"

namespace retort::engine {
namespace fs = std::filesystem;

namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// The canonical form of a path that may not exist yet, for comparisons.
fs::path canonical_form(const std::string& path) {
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  return fs::weakly_canonical(error ? fs::path(path) : absolute, error);
}

}  // namespace

std::vector<std::string> another_runs_files(const std::string& run_dir) {
  std::vector<std::string> found;
  std::error_code error;
  const fs::path dir(run_dir), checkpoints = dir / "checkpoints";
  if (fs::is_directory(checkpoints, error))
    for (const fs::directory_entry& e : fs::directory_iterator(checkpoints, error)) {
      const std::string name = e.path().filename().string();
      if (starts_with(name, "step_") || name == "latest") found.push_back(e.path().string());
    }
  if (fs::exists(dir / "metrics.jsonl", error)) found.push_back((dir / "metrics.jsonl").string());
  if (fs::is_directory(dir, error))
    for (const fs::directory_entry& e : fs::directory_iterator(dir, error))
      if (starts_with(e.path().filename().string(), "events.out.tfevents."))
        found.push_back(e.path().string());
  if (fs::exists(dir / "trace", error)) found.push_back((dir / "trace").string());
  std::sort(found.begin(), found.end());
  return found;
}

bool resumes_run_folder(const std::string& load, const std::string& run_dir) {
  if (load == "auto") return true;
  if (load.empty()) return false;
  const fs::path target = canonical_form(load), dir = canonical_form(run_dir);
  if (target == dir) return true;
  const fs::path checkpoints = dir / "checkpoints";
  const std::string inside = target.string(), root = checkpoints.string() + "/";
  return starts_with(inside, root);
}

void claim_run_folder(const std::string& run_dir, const std::string& load, bool overwrite,
                      std::ostream* log) {
  if (resumes_run_folder(load, run_dir)) return;
  const std::vector<std::string> files = another_runs_files(run_dir);
  if (files.empty()) return;
  if (!overwrite) {
    std::string named;
    for (size_t i = 0; i < files.size() && i < 3; ++i)
      named += (i ? ", " : "") + fs::path(files[i]).lexically_relative(run_dir).string();
    if (files.size() > 3) named += " and " + std::to_string(files.size() - 3) + " more";
    throw UserError("run.dir '" + run_dir + "' holds another run (" + named +
                    ") that this run would write over" +
                    (load.empty() ? "" : " (checkpoint.load names another folder)") +
                    ": resume it with checkpoint.load=auto, or give this run another run.dir; "
                    "run.overwrite=true would delete that run's files");
  }
  for (const std::string& file : files) {
    if (log) *log << "retort: run.overwrite: removing " << file << "\n";
    std::error_code error;
    fs::remove_all(file, error);
    if (error) throw UserError("run.overwrite: cannot remove '" + file + "': " + error.message());
  }
}

}  // namespace retort::engine
