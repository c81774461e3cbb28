// layers/vocab_parallel.cpp: see vocab_parallel.h.
#include "layers/vocab_parallel.h"

#include <limits>

namespace retort::layers {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
constexpr int64_t kIgnore = -100;

void all_reduce(torch::Tensor& t, parallel::Communicator* group, parallel::ReduceOp op) {
  if (group && group->size() > 1) group->all_reduce(t, op);
}

// Per-token cross-entropy over a vocabulary split across the group.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor logits, torch::Tensor targets,
                               int64_t vocab_start, int64_t vocab_size,
                               parallel::Communicator* group) {
    const int64_t local = logits.size(-1);
    torch::Tensor z = logits.reshape({-1, local});
    torch::Tensor t = targets.reshape({-1});
    torch::Tensor ids = torch::arange(vocab_start, vocab_start + local, t.options());
    torch::Tensor padded = ids >= vocab_size;
    z = z.masked_fill(padded, -std::numeric_limits<double>::infinity());

    torch::Tensor max = std::get<0>(z.max(-1)).contiguous();
    all_reduce(max, group, parallel::ReduceOp::Max);
    torch::Tensor shifted = z - max.unsqueeze(-1);

    torch::Tensor in_range = (t >= vocab_start) & (t < vocab_start + local);
    torch::Tensor local_index = torch::where(in_range, t - vocab_start, torch::zeros_like(t));
    // where(), not a product with the mask: a rank holding only padding has -inf logits.
    torch::Tensor target_logit = torch::where(
        in_range, shifted.gather(1, local_index.unsqueeze(1)).squeeze(1),
        torch::zeros({}, shifted.options()));
    target_logit = target_logit.contiguous();
    all_reduce(target_logit, group, parallel::ReduceOp::Sum);

    torch::Tensor exp = shifted.exp();
    torch::Tensor sum_exp = exp.sum(-1).contiguous();
    all_reduce(sum_exp, group, parallel::ReduceOp::Sum);

    torch::Tensor keep = t.ne(kIgnore).to(shifted.dtype());
    torch::Tensor loss = (sum_exp.log() - target_logit) * keep;
    // Saved for backward: softmax over the local slice and where the target sits.
    torch::Tensor softmax = exp.div_(sum_exp.unsqueeze(-1));
    ctx->save_for_backward({softmax, local_index, (in_range & t.ne(kIgnore)), keep});
    ctx->saved_data["shape"] = logits.sizes().vec();
    return loss.view(targets.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor softmax = saved[0], local_index = saved[1], hit = saved[2], keep = saved[3];
    torch::Tensor g = grad_outputs[0].reshape({-1}) * keep;
    torch::Tensor grad = softmax * g.unsqueeze(-1);
    grad.scatter_add_(1, local_index.unsqueeze(1), (-g * hit.to(g.dtype())).unsqueeze(1));
    auto shape = ctx->saved_data["shape"].toIntVector();
    return {grad.view(shape), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_embedding(const torch::Tensor& tokens, const torch::Tensor& weight,
                                       const TensorParallel& tp) {
  if (tp.size() == 1) return torch::embedding(weight, tokens);
  const int64_t local = weight.size(0), start = tp.rank() * local;
  torch::Tensor in_range = (tokens >= start) & (tokens < start + local);
  torch::Tensor index = torch::where(in_range, tokens - start, torch::zeros_like(tokens));
  torch::Tensor partial =
      torch::embedding(weight, index) * in_range.unsqueeze(-1).to(weight.dtype());
  return tp.exit_row(partial);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_size,
                                           const TensorParallel& tp) {
  const int64_t start = tp.rank() * logits.size(-1);
  return VocabParallelCrossEntropy::apply(logits, targets, start, vocab_size, tp.group);
}

torch::Tensor mask_padded_logits(const torch::Tensor& logits, int64_t vocab_size,
                                 const TensorParallel& tp) {
  const int64_t local = logits.size(-1), start = tp.rank() * local;
  if (start + local <= vocab_size) return logits;
  torch::Tensor ids = torch::arange(start, start + local, torch::kLong);
  return logits.masked_fill(ids >= vocab_size, -std::numeric_limits<double>::infinity());
}

}  // namespace retort::layers
