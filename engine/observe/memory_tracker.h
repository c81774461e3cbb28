// engine/observe/memory_tracker.h: exact current and peak bytes of tensor memory, by wrapping
// the CPU allocator (and, for GPU tensors, through the CUDA caching allocator's trace,
// cuda_memory_trace.h): each allocation adds its size to the category current at the time
// (common/memory_category.h) and its release subtracts it. A process's tensors are on one
// kind of device, so the two are one account. The device figure
// is every category except `offloaded` (the host store of offloaded activations, which on a
// GPU build is host memory); at each new device peak the split by category is recorded, so
// the peak reads as parameters + gradients + optimizer state + activations + teacher + rest.
// Installed once per process; tensors allocated before installation are not counted.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "common/memory_category.h"

namespace at {
class Tensor;
}

namespace retort::engine {

struct MemorySplit {
  std::array<int64_t, kMemoryCategories> bytes{};
  int64_t of(MemoryCategory c) const { return bytes[int(c)]; }
  // Everything but the offloaded host store.
  int64_t device() const;
};

class MemoryTracker {
 public:
  // Installs the tracking allocator (idempotent) and returns the process-wide tracker.
  static MemoryTracker& install();
  int64_t current_bytes() const;  // device
  int64_t peak_bytes() const;     // device
  MemorySplit current_split() const;
  // The split at the moment of the device peak.
  MemorySplit peak_split() const;
  // Each category's own peak, at whatever moment it came (the activations' is the most the
  // step held for backward at once, wherever the device peak fell).
  MemorySplit category_peaks() const;
  // Peak of the offloaded host store.
  int64_t peak_offloaded_bytes() const;
  // Starts a new peak measurement from the current level.
  void reset_peak();
  // Files the memory of t's storage under `category` from now on (gradients are allocated
  // inside backward as temporaries and become gradients when accumulated). No effect on
  // memory not allocated through the tracker.
  void retag(const at::Tensor& t, MemoryCategory category);
  // Memory allocated outside torch's allocator (the shared-memory DP segments), filed under
  // `category` from now on; negative bytes when it is released.
  void add_outside(MemoryCategory category, int64_t bytes);
  // A block handed out at `data` (by the tracking CPU allocator, or the CUDA caching allocator
  // through engine/observe/cuda_memory_trace.h): filed under the current category until
  // note_released(data).
  static void note_allocated(void* data, int64_t bytes);
  static void note_released(void* data);
};

}  // namespace retort::engine
