// engine/train/head_gradient.cpp: see head_gradient.h.
#include "engine/train/head_gradient.h"

namespace retort::engine {

HeadGradient resolve_head_gradient(const TrainConfig& c, const HeadGradientFacts& facts) {
  if (!facts.head_here || facts.head_frozen) return HeadGradient::none;
  const bool tied = c.model.tied_embeddings;
  // The last stage's copy of a tied weight is final only after the first stage's sum: it
  // steps whole, after backward.
  if (tied && !facts.embedding_here) return HeadGradient::autograd;
  if (c.optimizer.in_backward) return HeadGradient::stepped_in_backward;
  // Reduced over DP while backward runs: tied here (else its sum would wait for the lookup at
  // the end of backward), or in blocks when asked; an untied head's bucket is final early.
  if (facts.dp_size > 1 && (tied || c.parallel.dp_head_blocks))
    return HeadGradient::reduced_in_blocks;
  if (!tied) return HeadGradient::autograd;
  // Deferral needs the LM loss's fused head (the logit losses form the gradient in forward).
  if (c.memory.defer_head_gradient && !c.distill.enabled && c.memory.head_chunk_tokens > 0)
    return HeadGradient::tied_deferred;
  return HeadGradient::tied_in_place;
}

bool streams_to_stepper(HeadGradient mode) {
  return mode == HeadGradient::stepped_in_backward || mode == HeadGradient::reduced_in_blocks;
}

}  // namespace retort::engine
