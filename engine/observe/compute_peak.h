// engine/observe/compute_peak.h: the fp32 peak MFU is measured against. Either the user's
// runtime.peak_gflops (the hardware's datasheet peak per rank), or measured: the rate of one
// core running the FMA chains of kernels/fma_peak.h, which no matrix product can pass, times
// this rank's share of the cores (its threads, at most the cores on its host divided among the
// host's ranks). The core's rate is a property of the machine, not of its load at start-up:
// each round is timed by the thread's own CPU clock (time spent descheduled while other
// processes run does not count), the best of many short rounds is taken, and the best rate
// ever measured on a CPU of the same signature is kept in a small per-machine file, so a busy
// moment can only be outvoted by an earlier idle one.
#pragma once
#include <string>

namespace retort::engine {

struct ComputePeak {
  double gflops = 0;       // per rank
  double core_gflops = 0;  // one core's rate
  double cores = 0;        // this rank's share of the cores
  std::string how;         // for the banner: where the figure comes from
};

// The best rate of one core over short rounds of kernels::fma_chains, against the cache at
// compute_peak_cache_path() (read, and raised when this measurement beats it), times
// min(threads, available cores / ranks_on_host).
ComputePeak measure_compute_peak(int threads, int ranks_on_host = 1);

// $RETORT_PEAK_CACHE, else $XDG_CACHE_HOME/retort/compute_peak.tsv, else
// ~/.cache/retort/compute_peak.tsv; "" where none can be named (the rate is then not kept).
// RETORT_PEAK_CACHE=off keeps nothing.
std::string compute_peak_cache_path();

}  // namespace retort::engine
