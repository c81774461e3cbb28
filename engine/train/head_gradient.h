// engine/train/head_gradient.h: how the LM head weight's gradient reaches the optimizer on one
// pipeline stage, resolved once from optimizer.in_backward, parallel.dp_head_blocks,
// memory.defer_head_gradient, memory.head_chunk_tokens and model.tied_embeddings with the stage,
// the DP size and whether the run distills. The trainer builds its parts from the mode (the
// HeadRowStepper, the streamed bucket, the keys-without-effect fact).
// No torch here.
#pragma once

#include "engine/config/train_config.h"

namespace retort::engine {

enum class HeadGradient {
  none,           // no head on this stage, or its weight frozen
  autograd,       // formed by the head and left to autograd and the DP buckets (also the last
                  // stage's copy of a tied weight, summed with the first stage's afterwards)
  tied_in_place,  // tied on this stage: the lookup's rows add into the head's gradient in place
  tied_deferred,  // tied on this stage, memory.defer_head_gradient: the head's gradient is formed
                  // at the lookup's backward, for every micro-batch
  stepped_in_backward,  // optimizer.in_backward: formed block by block in backward, each block
                        // stepped as it is final (HeadRowStepper with AdamW)
  reduced_in_blocks,    // DP > 1, tied on this stage or parallel.dp_head_blocks: the last
                        // micro-batch's blocks are summed over DP as backward forms them
};

struct HeadGradientFacts {
  bool embedding_here = true, head_here = true;  // this pipeline stage's ends
  int dp_size = 1;
  bool head_frozen = false;
};

HeadGradient resolve_head_gradient(const TrainConfig& config, const HeadGradientFacts& facts);
// The mode's weight goes to a HeadRowStepper (block by block, not through a DP bucket).
bool streams_to_stepper(HeadGradient mode);

}  // namespace retort::engine
