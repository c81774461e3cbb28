// engine/consistency/consistency_command.h: the gradient-consistency suite as one command,
//   mpirun -np N PROGRAM CONFIG.yaml [key=value ...] [--layouts TP1,TP2,...] [--out DIR]
//          [--accumulation 2] [--reference-accumulation 1] [--exact] [--tolerance X]
//          [--reference-key key=value ...]
// run by engine_consistency and, with a fault injected into the layouts after the
// reference, by the suite's self-test. Runs the same short training under each layout on a
// subset of the ranks, writes DIR/<layout>.h5 and prints the table of relative differences
// against the first layout and every failed check. Returns 0 when every layout agrees, 1
// when one does not; bad input throws UserError.
// The reference takes the global batch in --reference-accumulation micro-batches (one by
// default) while the other layouts accumulate --accumulation: a step's loss scaling that
// depended on the micro-batch count would then show in every comparison. --exact holds
// every loss, term, gradient and activation bitwise to the reference's (the gradient norm, a
// sum of squares whose order ZeRO's shards change, to 1e-6), for layouts that make the same
// calls on the same shapes by construction: DP2 against TP1 accumulating its two micro-batches
// (each DP element one float32 sum of two addends, the same in any order).
#pragma once
#include <cstddef>
#include <functional>

#include "parallel/mpi_runtime.h"

namespace retort::engine {

// before_layout(i) runs on every rank before layout i (0 is the reference).
int run_consistency_command(int argc, char** argv, parallel::MpiRuntime& mpi,
                            const std::function<void(size_t)>& before_layout = {});

}  // namespace retort::engine
