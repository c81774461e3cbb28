// common/resident_memory.h: how much of this process's memory is resident, and how much of
// that sits in transparent huge pages (2 MB on x86-64), as the kernel reports it in
// /proc/self/smaps_rollup. The engine asks its allocator for huge pages (process_setup.h);
// this is what shows whether the kernel gave them. No torch here.
#pragma once
#include <cstdint>
#include <string>

namespace retort {

struct ResidentMemory {
  int64_t resident_bytes = -1;   // Rss; -1 when the kernel does not report it
  int64_t huge_page_bytes = -1;  // AnonHugePages; -1 when not reported
};

// Reads /proc/self/smaps_rollup (about a millisecond for a 1 GB process).
ResidentMemory read_resident_memory();
// Parses the text of a smaps_rollup file.
ResidentMemory parse_smaps_rollup(const std::string& text);
// The system's transparent huge page mode, the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled: "always", "madvise", "never", or "" if absent.
std::string transparent_huge_page_mode();

}  // namespace retort
