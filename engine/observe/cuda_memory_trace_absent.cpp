// engine/observe/cuda_memory_trace_absent.cpp: see cuda_memory_trace.h (builds without CUDA:
// there is no CUDA memory to trace).
#include "engine/observe/cuda_memory_trace.h"

namespace retort::engine {

void attach_cuda_memory_trace() {}

}  // namespace retort::engine
