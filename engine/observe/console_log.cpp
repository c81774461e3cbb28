// engine/observe/console_log.cpp: see console_log.h.
#include "engine/observe/console_log.h"

namespace retort::engine {
namespace {
constexpr const char* kEraseLine = "\r\033[K";  // to column 0, then clear to the end
}  // namespace

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
