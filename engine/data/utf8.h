// engine/data/utf8.h: UTF-8 helpers for tokenizers. Text read from files may hold invalid
// UTF-8; it is decoded the way the WHATWG Encoding standard (Node's TextDecoder, Python's
// "replace" error handler) does: each maximal invalid subpart becomes one U+FFFD.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace retort::engine {

// `text` with every invalid sequence replaced by U+FFFD (EF BF BD); valid text is unchanged.
std::string utf8_lossy(std::string_view text);

// Appends code point `cp` as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace retort::engine
