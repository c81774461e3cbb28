// engine/observe/console_log.cpp: see console_log.h.
#include "engine/observe/console_log.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace retort::engine {
namespace {
constexpr const char* kEraseLine = "\r\033[K";  // to column 0, then clear to the end
}  // namespace

bool stdout_is_terminal() {
  if (!isatty(STDOUT_FILENO)) return false;
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE")) return true;
  char target[256] = {};
  const std::string parent_stdout = "/proc/" + std::to_string(getppid()) + "/fd/1";
  if (readlink(parent_stdout.c_str(), target, sizeof(target) - 1) <= 0) return false;
  const std::string where = target;
  return where.rfind("/dev/pts/", 0) == 0 || where.rfind("/dev/tty", 0) == 0;
}

void ConsoleLog::line(const std::string& text) {
  if (!out_) return;
  if (progress_shown_) *out_ << kEraseLine;
  progress_shown_ = false;
  *out_ << text << std::endl;
}

void ConsoleLog::progress(const std::string& text) {
  if (!out_ || !terminal_) return;
  *out_ << kEraseLine << text << std::flush;
  progress_shown_ = true;
}

}  // namespace retort::engine
