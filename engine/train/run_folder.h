// engine/train/run_folder.h: a run folder belongs to one run. A run that starts fresh
// (checkpoint.load: '') or from another folder's checkpoint must not write its checkpoints,
// metrics and events over another run's: it stops with one line that says how to resume that
// run or where else to go, unless run.overwrite: true, which removes them and says what it
// removed. Resuming (checkpoint.load: auto, or a checkpoint of this folder) continues the run
// the folder holds.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace retort::engine {

// What of run_dir a new run would write over: its checkpoints/ step folders (complete or
// not) and latest file, metrics.jsonl, TensorBoard event files and trace/, as paths.
std::vector<std::string> another_runs_files(const std::string& run_dir);

// Whether checkpoint.load names a checkpoint of run_dir itself (or run_dir, or "auto"):
// a resume of the run it holds.
bool resumes_run_folder(const std::string& load, const std::string& run_dir);

// Throws UserError when run_dir holds another run and this run does not resume it, unless
// overwrite, which removes those files first, listing them on `log` (may be null).
void claim_run_folder(const std::string& run_dir, const std::string& load, bool overwrite,
                      std::ostream* log);

}  // namespace retort::engine
