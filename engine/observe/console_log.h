// engine/observe/console_log.h: console output of a run. On a terminal a progress line is
// redrawn in place after every step (carriage return, erase line) and permanent lines are
// printed above it; elsewhere (CI logs, files, pipes) only the permanent lines appear, one
// per line. No torch here.
#pragma once
#include <ostream>
#include <string>

namespace retort::engine {

// Whether this process's standard output reaches a terminal. Under mpirun a rank's stdout
// is a pseudo-terminal of mpirun's even when mpirun writes to a file or pipe, so there the
// answer is whether mpirun's own stdout (the parent's) is a terminal.
bool stdout_is_terminal();

class ConsoleLog {
 public:
  // `out` null: silent (ranks other than 0). `terminal`: out is a terminal (isatty).
  ConsoleLog(std::ostream* out, bool terminal) : out_(out), terminal_(terminal) {}
  // A line that stays.
  void line(const std::string& text);
  // Replaces the progress line (terminal only; elsewhere nothing is written).
  void progress(const std::string& text);
  bool terminal() const { return terminal_; }

 private:
  std::ostream* out_;
  bool terminal_;
  bool progress_shown_ = false;
};

}  // namespace retort::engine
