// engine/observe/cuda_memory_trace.cpp: see cuda_memory_trace.h (builds with CUDA).
#include "engine/observe/cuda_memory_trace.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "engine/observe/memory_tracker.h"

namespace retort::engine {

void attach_cuda_memory_trace() {
  static const bool attached = [] {
    // The allocator's per-GPU parts exist once CUDA is initialised; a tracker attached before
    // would reach none of them.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    using Entry = c10::cuda::CUDACachingAllocator::TraceEntry;
    // Called under the allocator's lock: no torch calls in here.
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker([](const Entry& entry) {
      void* block = reinterpret_cast<void*>(entry.addr_);
      if (entry.action_ == Entry::Action::ALLOC)
        MemoryTracker::note_allocated(block, static_cast<int64_t>(entry.size_));
      else if (entry.action_ == Entry::Action::FREE_COMPLETED)
        MemoryTracker::note_released(block);
    });
    return true;
  }();
  (void)attached;
}

}  // namespace retort::engine
