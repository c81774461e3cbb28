// common/compute_threads.h: one thread count for both pools a step uses, torch's intra-op
// (OpenMP) workers and the BLAS library's own threads (see process_setup.h), so the GEMM
// peak behind MFU and the step run with the same threading.
#pragma once
#include <torch/torch.h>

#include "common/process_setup.h"

namespace retort {

inline void set_compute_threads(int threads) {
  torch::set_num_threads(threads);
  set_blas_threads(threads);
}

}  // namespace retort
