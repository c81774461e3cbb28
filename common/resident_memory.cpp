// common/resident_memory.cpp: see resident_memory.h.
#include "common/resident_memory.h"

#include <fstream>
#include <sstream>

namespace retort {

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of a "Name:   1234 kB" line, in bytes; -1 when the line is missing.
int64_t kilobyte_field(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name + ":", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      std::istringstream line(text.substr(at + name.size() + 1, 64));
      int64_t kilobytes = -1;
      if (line >> kilobytes) return kilobytes * 1024;
      return -1;
    }
    at += name.size();
  }
  return -1;
}

}  // namespace

ResidentMemory parse_smaps_rollup(const std::string& text) {
  return {kilobyte_field(text, "Rss"), kilobyte_field(text, "AnonHugePages")};
}

ResidentMemory read_resident_memory() {
  return parse_smaps_rollup(read_file("/proc/self/smaps_rollup"));
}

std::string transparent_huge_page_mode() {
  const std::string text = read_file("/sys/kernel/mm/transparent_hugepage/enabled");
  const size_t open = text.find('['), close = text.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return text.substr(open + 1, close - open - 1);
}

}  // namespace retort
