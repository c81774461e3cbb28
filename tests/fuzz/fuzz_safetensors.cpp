// tests/fuzz/fuzz_safetensors.cpp: libFuzzer target for the safetensors header parser. The
// first 8 bytes of the input give the size of the data section (modulo 1 MB), the rest is
// the header JSON. Bad headers must end in UserError; anything else escaping, a crash or a
// sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/user_error.h"
#include "engine/hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_bytes = 0;
  std::memcpy(&data_bytes, data, 8);
  data_bytes %= 1u << 20;
  const std::string_view json(reinterpret_cast<const char*>(data) + 8, size - 8);
  try {
    retort::hf::StHeader header = retort::hf::parse_safetensors_header(json, data_bytes, "fuzz");
    for (const auto& t : header.tensors) (void)t.numel();
  } catch (const retort::UserError&) {
  }
  return 0;
}
