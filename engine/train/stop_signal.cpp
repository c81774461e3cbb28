// engine/train/stop_signal.cpp: see stop_signal.h.
#include "engine/train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace retort::engine {
namespace {

std::atomic<int> received_signal{0};

void write_stderr(const char* text) {
  (void)!::write(STDERR_FILENO, text, std::strlen(text));
}

// Async-signal-safe: an atomic exchange, write(2) and _exit(2) only.
void on_stop_signal(int signal) {
  if (received_signal.exchange(signal) != 0) {
    write_stderr("retort: second stop signal: exiting now, without saving\n");
    ::_exit(128 + signal);
  }
  write_stderr(
      "retort: stop signal received: finishing the current step, then saving a checkpoint "
      "(send it again to exit at once)\n");
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls (MPI's, file I/O) carry on
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int stop_signal_received() {
  return received_signal.load();
}

const char* stop_signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "signal";
}

}  // namespace retort::engine
