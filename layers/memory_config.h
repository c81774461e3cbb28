// layers/memory_config.h: the memory.* keys: how blocks keep what backward needs. Activation
// checkpointing recomputes in backward what the forward did not keep (layers/recompute.h);
// offloading moves what it keeps to a host store until backward. Plain C++.
#pragma once
#include "common/config_fields.h"

namespace retort::layers {

RETORT_NAMED_ENUM(Checkpointing, none, full, selective)

#define RETORT_MEMORY_KEYS(KEY)                                                                  \
  KEY(Checkpointing, activation_checkpointing, "memory.activation_checkpointing",                \
      Checkpointing::none, 0, 0,                                                                 \
      "none | full (keep each block's input, recompute the block in backward) | selective "      \
      "(recompute the attention core and the SwiGLU product)")                                   \
  KEY(bool, activation_offloading, "memory.activation_offloading", false, 0, 0,                  \
      "move what checkpointing keeps to the host store during forward, back one block ahead in " \
      "backward (needs activation_checkpointing full or selective)")                             \
  KEY(int64_t, head_chunk_tokens, "memory.head_chunk_tokens", 256, 0, 1e9,                       \
      "tokens per chunk of the fused LM head + cross-entropy (no [tokens, vocab] logits); "      \
      "0 = unfused; with runtime.device=cuda the default is 4096")                               \
  KEY(bool, defer_head_gradient, "memory.defer_head_gradient", false, 0, 0,                      \
      "form the tied LM head's weight gradient at the end of backward, where the embedding's "   \
      "rows add into it, not in forward: the logits are formed once more, a block of "           \
      "vocabulary rows at a time, and the gradient never coexists with the saved activations "   \
      "(a head tied to the embedding on the same stage; elsewhere it is formed in forward)")     \
  KEY(bool, keep_compute_weights, "memory.keep_compute_weights", true, 0, 0,                     \
      "under model.dtype=bfloat16, keep each weight's bf16 copy from one optimizer step to the " \
      "next; false: cast it at each use, in forward and again in backward (2 bytes per "         \
      "parameter less, two casts of every weight per micro-batch)")                              \
  KEY(bool, fused_kernels, "memory.fused_kernels", true, 0, 0,                                   \
      "one-pass RMSNorm, SwiGLU and in-place RoPE with hand-written backward (keep less for "    \
      "backward); false = composed torch ops")                                                   \
  KEY(int64_t, attention_block_rows, "memory.attention_block_rows", 128, 0, 1e9,                 \
      "query rows per block of the causal attention (online softmax, no batch x heads x seq "    \
      "x seq scores, blocks above the diagonal skipped); 0 = dense attention")

struct MemoryConfig {
  RETORT_MEMORY_KEYS(RETORT_FIELD)
};

}  // namespace retort::layers
