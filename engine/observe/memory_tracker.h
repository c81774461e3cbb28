// engine/observe/memory_tracker.h: exact current and peak bytes of CPU tensor memory, by wrapping
// the CPU allocator: each allocation adds its size and its DataPtr's deleter subtracts it.
// Installed once per process; tensors allocated before installation are not counted.
#pragma once
#include <cstdint>

namespace retort::engine {

class MemoryTracker {
 public:
  // Installs the tracking allocator (idempotent) and returns the process-wide tracker.
  static MemoryTracker& install();
  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  // Starts a new peak measurement from the current level.
  void reset_peak();
};

}  // namespace retort::engine
