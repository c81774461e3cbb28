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
      "0 = unfused")                                                                             \
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
