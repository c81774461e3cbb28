// tests/unit/crc32c_test.cpp: CRC-32C against its published check value and a bitwise
// reference, on lengths that exercise the 8-byte path and its tail, and continuation.
#include "kernels/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

uint32_t bitwise(const std::vector<uint8_t>& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t b : data) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

}  // namespace

TEST(Crc32c, CheckValueAndBitwiseReference) {
  const std::string check = "123456789";
  EXPECT_EQ(retort::crc32c(check.data(), check.size()), 0xE3069283u);  // the standard check
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 131 + 7);
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 999, 1000}) {
    std::vector<uint8_t> part(data.begin(), data.begin() + long(n));
    EXPECT_EQ(retort::crc32c(part.data(), n), bitwise(part)) << n;
  }
  // Continuing from a partial CRC equals one pass.
  EXPECT_EQ(retort::crc32c(data.data() + 300, 700, retort::crc32c(data.data(), 300)),
            retort::crc32c(data.data(), 1000));
}
