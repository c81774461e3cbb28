// engine/data/utf8.cpp: see utf8.h. The decoder follows the WHATWG UTF-8 decoder: lower and
// upper bounds for the second byte of E0, ED, F0 and F4 sequences, and an invalid byte ends a
// sequence without being consumed (it is looked at again as the start of the next one).
#include "engine/data/utf8.h"

namespace retort::engine {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view text) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const uint8_t b = uint8_t(text[i]);
    if (b < 0x80) {
      out += char(b);
      ++i;
      continue;
    }
    int need = 0;
    uint8_t lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;
    } else {  // a continuation byte or C0, C1, F5..FF: one replacement, byte consumed
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = i + 1;
    int seen = 0;
    bool ok = true;
    for (; seen < need; ++seen, ++j) {
      if (j >= n) {
        ok = false;
        break;
      }
      const uint8_t c = uint8_t(text[j]);
      if (c < lower || c > upper) {
        ok = false;
        break;
      }
      lower = 0x80;
      upper = 0xBF;
    }
    if (ok) {
      out.append(text.substr(i, j - i));
    } else {
      out += kReplacement;  // the bytes so far are one maximal subpart
    }
    i = j;
  }
  return out;
}

}  // namespace retort::engine
