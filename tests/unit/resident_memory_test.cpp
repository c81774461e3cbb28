// tests/unit/resident_memory_test.cpp: the resident and huge-page bytes read from
// smaps_rollup text (a kernel's own, with the look-alike fields that must not be taken), and
// the live file's figures growing by what a touched allocation adds.
#include "common/resident_memory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace retort {
namespace {

TEST(ResidentMemory, TakesRssAndAnonHugePagesNotTheirLookAlikes) {
  const std::string text =
      "55d0c0a00000-7ffd2b5f9000 ---p 00000000 00:00 0                          [rollup]\n"
      "Rss:              305540 kB\n"
      "Pss:              300100 kB\n"
      "Pss_Anon:         290000 kB\n"
      "Shared_Clean:       5000 kB\n"
      "AnonHugePages:    155648 kB\n"
      "ShmemPmdMapped:        0 kB\n"
      "FilePmdMapped:      2048 kB\n";
  const ResidentMemory m = parse_smaps_rollup(text);
  EXPECT_EQ(m.resident_bytes, 305540LL * 1024);
  EXPECT_EQ(m.huge_page_bytes, 155648LL * 1024);
}

TEST(ResidentMemory, MissingFieldsReadAsUnknown) {
  const ResidentMemory m = parse_smaps_rollup("Pss_Rss: 12 kB\nXAnonHugePages: 4 kB\n");
  EXPECT_EQ(m.resident_bytes, -1);
  EXPECT_EQ(m.huge_page_bytes, -1);
}

TEST(ResidentMemory, LiveFileGrowsByATouchedAllocation) {
  const ResidentMemory before = read_resident_memory();
  ASSERT_GT(before.resident_bytes, 0) << "this kernel reports no Rss in smaps_rollup";
  constexpr size_t kBytes = 64 << 20;
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const ResidentMemory after = read_resident_memory();
  EXPECT_GE(after.resident_bytes - before.resident_bytes, int64_t(kBytes) * 9 / 10);
  std::free(block);
}

}  // namespace
}  // namespace retort
