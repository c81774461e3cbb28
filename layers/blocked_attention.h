// layers/blocked_attention.h: causal (optionally sliding-window) grouped-query attention that
// never forms the batch x heads x seq x seq scores. Queries go in blocks of `block_rows`;
// each block meets only the keys its rows can see (blocks above the diagonal and outside the
// window are skipped, so the work is the causal half, not the full square), in key blocks of
// at most `key_block` with the softmax carried online (running max and sum, as in
// FlashAttention). Forward keeps only the output and one log-sum-exp per query row; backward
// recomputes each block's probabilities from them (FlashAttention-2's backward).
//
// Same maths as grouped_attention(q, k, v, attention_mask(s, s, 0, window)) in functional.h,
// which the tests use as the reference.
#pragma once
#include <torch/torch.h>

#include "layers/kernel_policy.h"

namespace retort::layers {

// Keys a block of queries meets at a time, unless a caller names its own.
inline constexpr int64_t kAttentionKeyBlock = 512;

// q [b, heads, s, d], k and v [b, kv_heads, s, d] (heads a multiple of kv_heads, each kv head
// serving heads/kv_heads consecutive query heads); queries and keys both at positions 0..s-1.
// `mode`: whether the dispatch may send the blocks to our fused kernels (kernels/dispatch.h).
torch::Tensor blocked_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, int64_t window, int64_t block_rows,
                                int64_t key_block = kAttentionKeyBlock,
                                kernels::KernelMode mode = environment_kernel_mode());

}  // namespace retort::layers
