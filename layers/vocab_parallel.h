// layers/vocab_parallel.h: the vocabulary split over TP ranks (rows [start, start + local)
// of the padded embedding / LM head on each rank). The embedding looks up local rows and
// sums over ranks; the cross-entropy reduces the max, the target logit and the sum of
// exponentials over ranks and computes its gradient locally, never gathering the
// vocabulary. Rows at or beyond the real vocabulary (padding) never count.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "layers/head_grad_sink.h"
#include "layers/kernel_policy.h"
#include "layers/tensor_parallel.h"

namespace retort::layers {

// tokens [b, s] -> [b, s, h] (TP) or [b, s/tp, h] (STP). sparse_grad: the weight's gradient
// is row-sparse (only when another use of the weight, the tied LM head, gives it a dense
// gradient to add into: [vocab, h] then exists once, not three times, at the end of backward).
// type: the rows are cast to it (the compute type under mixed precision); default the weight's.
// tied_head (with sparse_grad): where the tied head left its dense gradient, which the rows'
// gradient adds into in place (TiedHeadGradientSink).
torch::Tensor vocab_parallel_embedding(const torch::Tensor& tokens, const torch::Tensor& weight,
                                       const TensorParallel& tp, bool sparse_grad = false,
                                       std::optional<torch::ScalarType> type = std::nullopt,
                                       TiedHeadGradientSink* tied_head = nullptr);

// logits [..., local_vocab] on each rank, targets [...] with kIgnoreIndex for padding.
// Returns the per-token loss [...] (0 where ignored), identical on every TP rank.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_size,
                                           const TensorParallel& tp);

// The LM head and the cross-entropy fused, chunk by chunk of tokens, so [tokens, vocab] logits
// never exist beyond one chunk: the sum over target tokens of the cross-entropy of
// logits = x @ weight^T. x [..., h] (the full sequence, after enter_column), weight
// [local_vocab, h], targets [...]. When autograd will need them (grad mode on and the input
// requires grad), the forward also computes d(sum)/dx and d(sum)/dweight chunk by chunk
// (the softmax minus one-hot times the chunk's input), which backward scales by the incoming
// gradient: no logits are saved and none recomputed. Returns a scalar, the same on every
// TP rank; d/dx is this rank's partial (summed by enter_column's backward).
// With a weight_grad_sink that streams, d/dweight is not formed in forward: backward forms it
// again block of rows by block (one more head matmul) and hands each block to the sink, not to
// autograd. With one that defers (TiedHeadGradientSink under memory.defer_head_gradient),
// backward hands the sink what forms it the same way, later (at the tied lookup's backward).
// `kernels`: the run's mode for its products, and whether its element-wise steps may run as row
// loops (alone on the vocabulary, where the dispatch sends them there).
torch::Tensor fused_head_cross_entropy_sum(const torch::Tensor& x, const torch::Tensor& weight,
                                           const torch::Tensor& targets, int64_t vocab_size,
                                           const TensorParallel& tp, int64_t chunk_tokens,
                                           HeadGradSink* weight_grad_sink = nullptr,
                                           const KernelPolicy& kernels = {});

// Sets the logits of padded vocabulary rows to -inf (for consumers of raw logits).
torch::Tensor mask_padded_logits(const torch::Tensor& logits, int64_t vocab_size,
                                 const TensorParallel& tp);

}  // namespace retort::layers
