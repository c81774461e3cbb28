// common/machine_memory.cpp: see machine_memory.h.
#include "common/machine_memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/user_error.h"

namespace retort {
namespace {

// A cgroup v2 limit ("max": none), -1 when there is none to read.
int64_t cgroup_limit_bytes() {
  std::ifstream in("/sys/fs/cgroup/memory.max");
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t cgroup_usage_bytes() {
  std::ifstream in("/sys/fs/cgroup/memory.current");
  int64_t used = -1;
  return in >> used ? used : -1;
}

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
  return text;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  const int64_t limit = cgroup_limit_bytes(), used = cgroup_usage_bytes();
  if (limit > 0 && used >= 0) {
    const int64_t left = std::max<int64_t>(0, limit - used);
    available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

void require_memory(int64_t bytes_per_process, int processes, const std::string& what) {
  const int64_t available = available_memory_bytes();
  processes = std::max(1, processes);
  if (available < 0 || double(bytes_per_process) * processes <= double(available)) return;
  std::ostringstream line;
  line << what << " needs " << gigabytes(double(bytes_per_process)) << " per process";
  if (processes > 1) line << ", x " << processes << " processes on this host";
  line << ", but the machine has " << gigabytes(double(available)) << " available";
  throw UserError(line.str());
}

}  // namespace retort
