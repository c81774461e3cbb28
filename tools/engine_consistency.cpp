// tools/engine_consistency.cpp: the gradient-consistency suite as one command (see
// engine/consistency/consistency_command.h):
//   mpirun -np 4 engine_consistency CONFIG.yaml [key=value ...] [--layouts TP1,TP2,...]
//          [--out DIR] [--accumulation 2]
// Exits 1 if any layout fails a check, 2 on bad input.
#include <iostream>

#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/consistency/consistency_command.h"
#include "parallel/mpi_runtime.h"

using namespace retort;

int main(int argc, char** argv) {
  setup_process(argv);  // before MPI: it may re-execute the program
  parallel::MpiRuntime mpi(&argc, &argv);
  try {
    return engine::run_consistency_command(argc, argv, mpi);
  } catch (const UserError& e) {
    parallel::MpiRuntime::exit_on_user_error(e.what());
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << std::endl;
    parallel::MpiRuntime::abort_all(3);
  }
}
