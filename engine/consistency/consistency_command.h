// engine/consistency/consistency_command.h: the gradient-consistency suite as one command,
//   mpirun -np N PROGRAM CONFIG.yaml [key=value ...] [--layouts TP1,TP2,...] [--out DIR]
//          [--accumulation 2]
// run by engine_consistency and, with a fault injected into the layouts after the
// reference, by the suite's self-test. Runs the same short training under each layout on a
// subset of the ranks, writes DIR/<layout>.h5 and prints the table of relative differences
// against the first layout and every failed check. Returns 0 when every layout agrees, 1
// when one does not; bad input throws UserError.
#pragma once
#include <cstddef>
#include <functional>

#include "parallel/mpi_runtime.h"

namespace retort::engine {

// before_layout(i) runs on every rank before layout i (0 is the reference).
int run_consistency_command(int argc, char** argv, parallel::MpiRuntime& mpi,
                            const std::function<void(size_t)>& before_layout = {});

}  // namespace retort::engine
