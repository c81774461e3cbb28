// distill/logit_losses.cpp: see logit_losses.h.
#include "distill/logit_losses.h"

#include <limits>

#include "common/user_error.h"

namespace retort::distill {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void tp_reduce(torch::Tensor& t, parallel::Communicator* group, parallel::ReduceOp op) {
  if (group && group->size() > 1) group->all_reduce(t, op);
}

// log-sum-exp over the split vocabulary of x [n, local] (padded entries already -inf).
torch::Tensor split_logsumexp(const torch::Tensor& x, parallel::Communicator* group) {
  torch::Tensor max = std::get<0>(x.max(-1)).contiguous();
  tp_reduce(max, group, parallel::ReduceOp::Max);
  torch::Tensor sum = (x - max.unsqueeze(-1)).exp().sum(-1).contiguous();
  tp_reduce(sum, group, parallel::ReduceOp::Sum);
  return sum.log() + max;
}

// Per-token partial loss on this rank's vocabulary slice; valid marks real vocabulary.
torch::Tensor partial_loss(LogitLoss kind, const torch::Tensor& log_q, const torch::Tensor& log_p,
                           const torch::Tensor& valid) {
  torch::Tensor zero = torch::zeros({}, log_q.options());
  torch::Tensor term;
  switch (kind) {
    case LogitLoss::ForwardKL: term = log_p.exp() * (log_p - log_q); break;
    case LogitLoss::ReverseKL: term = log_q.exp() * (log_q - log_p); break;
    case LogitLoss::SoftCrossEntropy: term = -log_p.exp() * log_q; break;
  }
  return torch::where(valid, term, zero).sum(-1);
}

struct LogitDistillation : torch::autograd::Function<LogitDistillation> {
  // s, t: [n, local]; w: [n]
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor s, torch::Tensor t,
                               torch::Tensor w, int64_t vocab_start, int64_t vocab_size,
                               int64_t kind, double temperature, double scale, int64_t chunk,
                               parallel::Communicator* group) {
    const int64_t n = s.size(0), local = s.size(1);
    torch::Tensor valid =
        (torch::arange(vocab_start, vocab_start + local, torch::kLong) < vocab_size).unsqueeze(0);
    torch::Tensor lse_s = torch::empty({n}, s.options()), lse_t = torch::empty({n}, s.options());
    torch::Tensor per_token = torch::empty({n}, s.options());
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      // Padded vocabulary never counts, whether or not the caller masked it already.
      const double inf = std::numeric_limits<double>::infinity();
      torch::Tensor ss = (s.narrow(0, start, len) / temperature).masked_fill(~valid, -inf);
      torch::Tensor tt = (t.narrow(0, start, len) / temperature).masked_fill(~valid, -inf);
      lse_s.narrow(0, start, len).copy_(split_logsumexp(ss, group));
      lse_t.narrow(0, start, len).copy_(split_logsumexp(tt, group));
      torch::Tensor log_q = ss - lse_s.narrow(0, start, len).unsqueeze(-1);
      torch::Tensor log_p = tt - lse_t.narrow(0, start, len).unsqueeze(-1);
      per_token.narrow(0, start, len).copy_(partial_loss(LogitLoss(kind), log_q, log_p, valid));
    }
    tp_reduce(per_token, group, parallel::ReduceOp::Sum);
    ctx->save_for_backward({s, t, w, lse_s, lse_t, per_token});
    ctx->saved_data["vocab_start"] = vocab_start;
    ctx->saved_data["vocab_size"] = vocab_size;
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["chunk"] = chunk;
    return (per_token * w).sum() * scale;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor s = saved[0], t = saved[1], w = saved[2], lse_s = saved[3], lse_t = saved[4],
                  per_token = saved[5];
    const int64_t start_vocab = ctx->saved_data["vocab_start"].toInt();
    const int64_t vocab_size = ctx->saved_data["vocab_size"].toInt();
    const auto kind = LogitLoss(ctx->saved_data["kind"].toInt());
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t n = s.size(0), local = s.size(1);
    torch::Tensor valid =
        (torch::arange(start_vocab, start_vocab + local, torch::kLong) < vocab_size).unsqueeze(0);
    // d loss / d s = coefficient per token * (...) / T
    torch::Tensor coefficient = grad_outputs[0] * w * (scale / temperature);
    torch::Tensor grad = torch::empty_like(s);
    torch::Tensor zero = torch::zeros({}, s.options());
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      torch::Tensor log_q = s.narrow(0, start, len) / temperature - lse_s.narrow(0, start, len).unsqueeze(-1);
      torch::Tensor log_p = t.narrow(0, start, len) / temperature - lse_t.narrow(0, start, len).unsqueeze(-1);
      torch::Tensor q = log_q.exp(), g;
      if (kind == LogitLoss::ReverseKL) {
        torch::Tensor diff = torch::where(valid, log_q - log_p, zero);
        g = q * (diff - per_token.narrow(0, start, len).unsqueeze(-1));
      } else {  // forward KL and soft cross-entropy share the gradient q - p
        g = q - log_p.exp();
      }
      g = torch::where(valid, g, zero);
      grad.narrow(0, start, len).copy_(g * coefficient.narrow(0, start, len).unsqueeze(-1));
    }
    variable_list out(10);
    out[0] = grad;
    return out;
  }
};

}  // namespace

LogitLoss parse_logit_loss(const std::string& name) {
  if (name == "forward_kl") return LogitLoss::ForwardKL;
  if (name == "reverse_kl") return LogitLoss::ReverseKL;
  if (name == "soft_ce") return LogitLoss::SoftCrossEntropy;
  throw UserError("distill.logit_loss='" + name + "': expected forward_kl, reverse_kl or soft_ce");
}

torch::Tensor logit_distillation_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                                     const torch::Tensor& weight, int64_t vocab_size,
                                     const LogitLossOptions& o, const layers::TensorParallel& tp) {
  const int64_t local = student.size(-1);
  const double scale = o.scale_by_t2 ? o.temperature * o.temperature : 1.0;
  return LogitDistillation::apply(student.reshape({-1, local}),
                                  teacher.detach().reshape({-1, local}),
                                  weight.reshape({-1}).to(student.scalar_type()),
                                  int64_t(tp.rank()) * local, vocab_size, int64_t(o.kind),
                                  o.temperature, scale, o.chunk_tokens, tp.group);
}

}  // namespace retort::distill
