// common/memory_category.h: what the memory being allocated is for. The engine marks the
// phases of a step with a MemoryScope (parameters, the student's forward, the teacher's
// forward, offloaded activations, ...); the tracking allocator (engine/observe/
// memory_tracker.h) files each allocation under the category current at the time and
// reports peak bytes by category. One process-wide setting: allocations come from the thread
// that drives the step. No torch here.
#pragma once
#include <atomic>
#include <string>

#include "common/named_enum.h"

namespace retort {

// compute_weights: the bf16 copies of float32 main weights under mixed precision
// (layers/compute_copy.h). offloaded: activations moved to the host store (not device memory;
// counted apart).
RETORT_NAMED_ENUM(MemoryCategory, parameters, compute_weights, gradients, optimizer_state,
                  activations, teacher_weights, teacher_activations, offloaded, other)
inline constexpr int kMemoryCategories = int(MemoryCategory::other) + 1;

inline std::atomic<int>& current_memory_category_slot() {
  static std::atomic<int> slot{int(MemoryCategory::other)};
  return slot;
}
inline MemoryCategory current_memory_category() {
  return MemoryCategory(current_memory_category_slot().load(std::memory_order_relaxed));
}

// Sets the category for the allocations of its lifetime, then restores the previous one.
class MemoryScope {
 public:
  explicit MemoryScope(MemoryCategory category)
      : previous_(current_memory_category_slot().exchange(int(category))) {}
  ~MemoryScope() { current_memory_category_slot().store(previous_); }
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  int previous_;
};

}  // namespace retort
