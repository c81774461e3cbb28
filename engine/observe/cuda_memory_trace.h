// engine/observe/cuda_memory_trace.h: the CUDA caching allocator's blocks into the memory
// tracker (memory_tracker.h). A trace callback of the allocator files each block handed out
// under the category current on the allocating thread, and takes it off when the allocator has
// really freed it (after the streams that used it are done). A build without CUDA does nothing.
#pragma once

namespace retort::engine {

// Initialises CUDA and attaches the trace; idempotent. For a process whose tensors are on a
// GPU (the Trainer calls it once it has chosen the rank's GPU), after MemoryTracker::install().
void attach_cuda_memory_trace();

}  // namespace retort::engine
