// kernels/crc32c.cpp: see crc32c.h. Eight bytes at a time with the SSE4.2 instruction where
// the CPU has it (picked at load time), else a byte table.
#include "kernels/crc32c.h"

#include <array>
#include <cstring>

namespace retort {
namespace {

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t crc_table(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = uint32_t(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  crc = sse42 ? crc_sse42(p, size, crc) : crc_table(p, size, crc);
#else
  crc = crc_table(p, size, crc);
#endif
  return ~crc;
}

}  // namespace retort
