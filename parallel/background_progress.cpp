// parallel/background_progress.cpp: see background_progress.h.
#include "parallel/background_progress.h"

#include <thread>

namespace retort::parallel {
namespace {

std::function<void()> registered;
std::thread::id owner;
bool driving = false;

}  // namespace

void set_background_progress(std::function<void()> progress) {
  registered = std::move(progress);
  owner = std::this_thread::get_id();
}

void drive_background_progress() {
  if (!registered || driving || std::this_thread::get_id() != owner) return;
  driving = true;
  registered();
  driving = false;
}

}  // namespace retort::parallel
