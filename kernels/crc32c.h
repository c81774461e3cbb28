// kernels/crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// checkpoint tensors and, masked, of TensorBoard's record framing. Torch-free.
#pragma once
#include <cstddef>
#include <cstdint>

namespace retort {

// The CRC-32C of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace retort
