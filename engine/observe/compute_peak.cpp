// engine/observe/compute_peak.cpp: see compute_peak.h.
#include "engine/observe/compute_peak.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/cpu_features.h"
#include "kernels/fma_peak.h"

namespace retort::engine {
namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// One core's best rate in GFLOP/s: rounds of about a millisecond each, timed by this thread's
// CPU clock, for about 40 ms of CPU time in all.
double best_core_rate() {
  constexpr int64_t kIterations = 20000;
  float sink = 0;
  kernels::fma_chains(kIterations, &sink);  // warm-up: the vector units' clocks come up
  double best = 0, spent = 0;
  for (int round = 0; round < 400 && spent < 0.04; ++round) {
    const double start = thread_cpu_seconds();
    const double flops = kernels::fma_chains(kIterations, &sink);
    const double seconds = thread_cpu_seconds() - start;
    spent += seconds;
    if (seconds > 0) best = std::max(best, flops / seconds / 1e9);
  }
  if (sink == 12345.0f) std::fprintf(stderr, " ");  // keeps the chains' result alive
  return best;
}

// The CPU's signature without the core count: the core's rate does not depend on it.
std::string cache_key() {
  const std::string signature = kernels::cpu_signature();
  return signature.substr(0, signature.rfind(", "));
}

double cached_rate(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  double best = 0;
  while (std::getline(in, line)) {
    const size_t tab = line.rfind('\t');
    if (tab == std::string::npos || line.compare(0, tab, key) != 0 || tab != key.size()) continue;
    best = std::max(best, std::strtod(line.c_str() + tab + 1, nullptr));
  }
  return best;
}

// Rewrites the file with `key`'s rate replaced (through a temporary file, so a reader never
// sees half of it). Failing to keep it costs only the next run's measurement.
void keep_rate(const std::string& path, const std::string& key, double rate) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  std::ostringstream kept;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + "\t") != 0) kept << line << "\n";
  char value[32];
  std::snprintf(value, sizeof value, "%.3f", rate);
  kept << key << "\t" << value << "\n";
  const std::string temporary = path + ".partial." + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    out << kept.str();
    if (!out) return;
  }
  std::filesystem::rename(temporary, path, error);
  if (error) std::filesystem::remove(temporary, error);
}

}  // namespace

std::string compute_peak_cache_path() {
  if (const char* chosen = std::getenv("RETORT_PEAK_CACHE"); chosen && *chosen)
    return std::string(chosen) == "off" ? "" : chosen;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache)
    return std::string(cache) + "/retort/compute_peak.tsv";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/retort/compute_peak.tsv";
  return "";
}

ComputePeak measure_compute_peak(int threads, int ranks_on_host) {
  const double measured = best_core_rate();
  const std::string path = compute_peak_cache_path(), key = cache_key();
  const double cached = path.empty() ? 0 : cached_rate(path, key);
  if (!path.empty() && measured > cached) keep_rate(path, key, measured);
  ComputePeak peak;
  peak.core_gflops = std::max(measured, cached);
  peak.cores = std::min(double(std::max(1, threads)),
                        double(kernels::available_cores()) / std::max(1, ranks_on_host));
  peak.gflops = peak.core_gflops * peak.cores;
  char how[512];
  std::snprintf(how, sizeof how,
                "measured: %s FMA chains, one core's best rate %.1f GFLOP/s (%s) x %.2f "
                "core(s) of this rank",
                kernels::isa_name(kernels::kernel_isa()), peak.core_gflops,
                path.empty()        ? "this run's, not kept"
                : cached > measured ? ("kept in " + path + " from an earlier run").c_str()
                                    : ("this run's, kept in " + path).c_str(),
                peak.cores);
  peak.how = how;
  return peak;
}

}  // namespace retort::engine
