// common/machine_memory.h: how much memory this machine can still give (the kernel's
// MemAvailable, capped by the cgroup's limit when the process runs in one), and a check that
// stops with one line, before any allocation, when a model or run plainly needs more. Without
// it the kernel's out-of-memory killer ends the process without a word, or an allocation fails
// deep inside a step as an internal error. No torch here.
#pragma once
#include <cstdint>
#include <string>

namespace retort {

// Bytes available to new allocations; -1 when the kernel does not say.
int64_t available_memory_bytes();

// Throws UserError "<what> needs N GB per process, x <processes> on this host, but the
// machine has M GB available" when bytes * processes exceeds what is available. Does nothing
// when the machine does not say how much it has.
void require_memory(int64_t bytes_per_process, int processes, const std::string& what);

}  // namespace retort
