// engine/train/parameter_patterns.h: the glob patterns of model.freeze and model.lr_scales
// checked against the parameters the model has, once at start-up, summed over the pipeline's
// stages (each holds some of them). A freeze pattern that matches nothing is a typo that would
// train what the user meant to freeze: it stops the run. An lr_scales pattern that matches
// nothing, and a freeze that leaves nothing to train, have no effect the user wants: they are
// said once on the log.
#pragma once
#include <ostream>

#include "engine/config/train_config.h"
#include "layers/parameters.h"
#include "parallel/communicator.h"

namespace retort::engine {

// Collective over `stages` (the pipeline group); every rank throws the same UserError.
void check_parameter_patterns(const ParamPolicy& policy, const layers::ParameterStore& store,
                              parallel::Communicator& stages, std::ostream* log);

}  // namespace retort::engine
