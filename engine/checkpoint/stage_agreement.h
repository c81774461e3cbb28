// engine/checkpoint/stage_agreement.h: bad input found on one pipeline stage only (a checkpoint
// that lacks one of its parameters, say) must stop every stage with the same message, or the others
// would wait forever in their next collective. run_agreed_over runs a phase on every member of a
// group and, if it fails on any, throws the first failing member's UserError on all of them.
#pragma once
#include <functional>

#include "parallel/communicator.h"

namespace retort::engine {

// Collective over `group` (null: just runs the phase).
void run_agreed_over(parallel::Communicator* group, const std::function<void()>& phase);

}  // namespace retort::engine
