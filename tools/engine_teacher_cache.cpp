// tools/engine_teacher_cache.cpp: runs a teacher once over a run's training data and stores its
// top k per position, for students to read with teacher.cache (see
// engine/teacher_cache/cache_command.h):
//   mpirun -np N engine_teacher_cache CONFIG.yaml [key=value ...] --out DIR [--top-k K]
//          [--samples N] [--resume]
//   engine_teacher_cache --info DIR
// Exits 2 on bad input, with one line naming the key, flag or file at fault.
#include <iostream>

#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/teacher_cache/cache_command.h"
#include "parallel/mpi_runtime.h"

using namespace retort;

int main(int argc, char** argv) {
  setup_process(argv);  // before MPI: it may re-execute the program
  parallel::MpiRuntime mpi(&argc, &argv);
  try {
    return engine::run_teacher_cache_command(argc, argv, mpi);
  } catch (const UserError& e) {
    parallel::MpiRuntime::exit_on_user_error(e.what());
  } catch (const c10::Error& e) {
    std::cerr << "internal error: " << e.what_without_backtrace() << std::endl;
    parallel::MpiRuntime::abort_all(3);
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << std::endl;
    parallel::MpiRuntime::abort_all(3);
  }
}
