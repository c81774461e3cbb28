// bench/bench_mpi_main.h: the main of a benchmark launched under mpirun: the process set-up
// (before MPI, as it may re-execute the program), MPI, then run(argc, argv, mpi); bad input
// ends every rank with "error: ..." from rank 0 and exit code 2.
#pragma once
#include <iostream>

#include "common/process_setup.h"
#include "common/user_error.h"
#include "parallel/mpi_runtime.h"

namespace retort::bench {

inline int mpi_main_reporting_errors(int (*run)(int, char**, parallel::MpiRuntime&), int argc,
                                     char** argv) {
  setup_process(argv);
  parallel::MpiRuntime mpi(&argc, &argv);
  try {
    return run(argc, argv, mpi);
  } catch (const UserError& e) {
    if (mpi.world_rank() == 0) std::cerr << "error: " << e.what() << std::endl;
    parallel::MpiRuntime::abort_all(2);
  }
}

}  // namespace retort::bench
