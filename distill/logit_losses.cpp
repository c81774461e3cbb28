// distill/logit_losses.cpp: see logit_losses.h.
#include "distill/logit_losses.h"

#include <algorithm>
#include <limits>

#include "common/user_error.h"

namespace retort::distill {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

void tp_reduce(torch::Tensor& t, parallel::Communicator* group, parallel::ReduceOp op) {
  if (group && group->size() > 1) group->all_reduce(t, op);
}

// log-sum-exp over the split vocabulary of x [n, local]; a rank may hold no column at all
// (its whole slice is padding), and then contributes nothing.
torch::Tensor split_logsumexp(const torch::Tensor& x, parallel::Communicator* group) {
  if (!group || group->size() == 1) return torch::logsumexp(x, -1);  // one fused kernel
  torch::Tensor max = x.size(-1) > 0 ? std::get<0>(x.max(-1)).contiguous()
                                     : torch::full({x.size(0)}, -kInfinity, x.options());
  tp_reduce(max, group, parallel::ReduceOp::Max);
  torch::Tensor sum = (x - max.unsqueeze(-1)).exp().sum(-1).contiguous();
  tp_reduce(sum, group, parallel::ReduceOp::Sum);
  return sum.log() + max;
}

torch::Tensor scaled(const torch::Tensor& x, double temperature) {
  return temperature == 1.0 ? x : x / temperature;  // no copy in the common case
}

// Per-token partial loss on this rank's (real) vocabulary slice.
torch::Tensor partial_loss(LogitLoss kind, const torch::Tensor& log_q, const torch::Tensor& log_p,
                           bool sparse_teacher) {
  torch::Tensor term;
  switch (kind) {
    case LogitLoss::forward_kl:
      term = log_p.exp().mul_(log_p - log_q);
      break;
    case LogitLoss::reverse_kl:
      term = log_q.exp().mul_(log_q - log_p);
      break;
    case LogitLoss::soft_ce:
      term = log_p.exp().mul_(log_q).neg_();
      break;
  }
  // Entries a top-k teacher leaves out (p = 0) give 0 * -inf in the forward KL: drop them.
  if (sparse_teacher && kind == LogitLoss::forward_kl)
    term = torch::where(log_p.isinf(), torch::zeros({}, term.options()), term);
  return term.sum(-1);
}

// out[i, target_i] -= c_i for the tokens whose target lies in this rank's real columns (a
// rank with none, its slice all padding, has nothing to subtract).
void subtract_target_one_hot(torch::Tensor& out, const torch::Tensor& c, const torch::Tensor& hit,
                             const torch::Tensor& local_index) {
  if (out.size(1) == 0) return;
  out.scatter_add_(1, local_index.unsqueeze(1), (-c * hit.to(c.dtype())).unsqueeze(1));
}

// The k-th largest teacher logit per token over the whole (split) vocabulary. Every rank
// contributes the same number of candidates (min(k, padded local width), -inf where it has
// fewer real entries), as the gather needs.
torch::Tensor top_k_threshold(const torch::Tensor& tt, int64_t k, int64_t padded_local,
                              parallel::Communicator* group) {
  const int64_t candidates = std::min(k, padded_local);
  torch::Tensor local = torch::full({tt.size(0), candidates}, -kInfinity, tt.options());
  const int64_t have = std::min(candidates, tt.size(1));
  if (have > 0) local.narrow(1, 0, have).copy_(std::get<0>(tt.topk(have, 1)));
  if (group && group->size() > 1) local = group->all_gather(local, 1);
  return std::get<0>(local.topk(k, 1)).select(1, k - 1).contiguous();
}

// Outputs [kd, ce]: the weighted sums of the logit loss (times the T^2 scale) and, when hard
// targets are given, of the LM cross-entropy on the same student logits. Computing both in
// one function lets the cross-entropy's softmax be recomputed in backward instead of kept.
//
// Padding: a rank's slice may end in padded vocabulary (or be padding only). Everything is
// computed on the real columns [0, real) of the slice, so every rank takes the same path and
// the log-sum-exp correction of the dense form is added once, identically on every rank;
// padded columns get a zero gradient.
struct LogitDistillation : torch::autograd::Function<LogitDistillation> {
  // s, t: [n, local]; w: [n]; targets: [n] or empty.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor s, torch::Tensor t,
                               torch::Tensor w, torch::Tensor targets, int64_t vocab_start,
                               int64_t vocab_size, int64_t kind, double temperature, double scale,
                               int64_t chunk, int64_t top_k, parallel::Communicator* group) {
    const int64_t n = s.size(0), local = s.size(1);
    const int64_t real = std::clamp<int64_t>(vocab_size - vocab_start, 0, local);
    const bool with_ce = targets.numel() > 0;
    // The same on every rank: the dense form needs a full teacher and p log p terms that vanish.
    const bool dense = top_k == 0 && LogitLoss(kind) != LogitLoss::reverse_kl;
    torch::Tensor sr = s.narrow(1, 0, real), tr = t.narrow(1, 0, real);
    torch::Tensor threshold = torch::empty({top_k > 0 ? n : 0}, s.options());
    torch::Tensor lse_s = torch::empty({n}, s.options()), lse_t = torch::empty({n}, s.options());
    torch::Tensor lse_1 = lse_s;  // log-sum-exp at T = 1, for the cross-entropy
    if (with_ce && temperature != 1.0) lse_1 = torch::empty({n}, s.options());
    torch::Tensor per_token = torch::empty({n}, s.options());
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      torch::Tensor ss = scaled(sr.narrow(0, start, len), temperature);
      torch::Tensor tt = scaled(tr.narrow(0, start, len), temperature);
      if (top_k > 0) {
        torch::Tensor th = threshold.narrow(0, start, len);
        th.copy_(top_k_threshold(tt, top_k, local, group));
        tt = tt.masked_fill(tt < th.unsqueeze(-1), -kInfinity);
      }
      lse_s.narrow(0, start, len).copy_(split_logsumexp(ss, group));
      lse_t.narrow(0, start, len).copy_(split_logsumexp(tt, group));
      if (with_ce && temperature != 1.0)
        lse_1.narrow(0, start, len).copy_(split_logsumexp(sr.narrow(0, start, len), group));
      if (dense) {  // fewer passes: the log-sum-exps are added once after the reduction
        torch::Tensor p = (tt - lse_t.narrow(0, start, len).unsqueeze(-1)).exp_();
        per_token.narrow(0, start, len)
            .copy_(LogitLoss(kind) == LogitLoss::forward_kl ? (p * (tt - ss)).sum(-1)
                                                            : -(p * ss).sum(-1));
        continue;
      }
      torch::Tensor log_q = ss - lse_s.narrow(0, start, len).unsqueeze(-1);
      torch::Tensor log_p = tt - lse_t.narrow(0, start, len).unsqueeze(-1);
      per_token.narrow(0, start, len).copy_(partial_loss(LogitLoss(kind), log_q, log_p, top_k > 0));
    }
    tp_reduce(per_token, group, parallel::ReduceOp::Sum);
    // Dense forms: sum p (log p - log q) = sum p (t - s) + lse_s - lse_t and
    // -sum p log q = -sum p s + lse_s, because p sums to one over the whole vocabulary.
    if (dense) per_token += LogitLoss(kind) == LogitLoss::forward_kl ? lse_s - lse_t : lse_s;
    torch::Tensor ce_sum = torch::zeros({}, s.options());
    torch::Tensor local_index = torch::zeros({0}, torch::kLong),
                  hit = torch::zeros({0}, torch::kBool);
    if (with_ce) {  // real targets only ever hit real columns
      hit = (targets >= vocab_start) & (targets < vocab_start + real);
      local_index = torch::where(hit, targets - vocab_start, torch::zeros_like(targets));
      torch::Tensor target_logit =
          torch::where(hit, s.gather(1, local_index.unsqueeze(1)).squeeze(1),
                       torch::zeros({}, s.options()))
              .contiguous();
      tp_reduce(target_logit, group, parallel::ReduceOp::Sum);
      ce_sum = ((lse_1 - target_logit) * w).sum();
    }
    ctx->save_for_backward({s, t, w, lse_s, lse_t, per_token, lse_1, local_index, hit, threshold});
    ctx->saved_data["real"] = real;
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["with_ce"] = with_ce;
    return torch::stack({(per_token * w).sum() * scale, ce_sum});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor s = saved[0], t = saved[1], w = saved[2], lse_s = saved[3], lse_t = saved[4],
                  per_token = saved[5], lse_1 = saved[6], local_index = saved[7], hit = saved[8],
                  threshold = saved[9];
    const int64_t real = ctx->saved_data["real"].toInt();
    const auto kind = LogitLoss(ctx->saved_data["kind"].toInt());
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool with_ce = ctx->saved_data["with_ce"].toBool();
    const int64_t n = s.size(0), local = s.size(1);
    const bool dense = threshold.numel() == 0 && kind != LogitLoss::reverse_kl;
    // d/ds of the logit loss is (...) / T per token; of the cross-entropy softmax - one-hot.
    torch::Tensor kd_coefficient = grad_outputs[0][0] * w * (scale / temperature);
    torch::Tensor ce_coefficient = grad_outputs[0][1] * w;
    // Padded columns keep a zero gradient; the real ones are all written below.
    torch::Tensor grad = real < local ? torch::zeros_like(s) : torch::empty_like(s);
    torch::Tensor sr = s.narrow(1, 0, real), tr = t.narrow(1, 0, real);
    torch::Tensor grad_real = grad.narrow(1, 0, real);
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      torch::Tensor ss = scaled(sr.narrow(0, start, len), temperature);
      torch::Tensor out = grad_real.narrow(0, start, len);
      torch::Tensor kd_c = kd_coefficient.narrow(0, start, len).unsqueeze(-1);
      torch::Tensor c = ce_coefficient.narrow(0, start, len);
      if (dense && (!with_ce || temperature == 1.0)) {  // q and p written in place
        torch::sub_out(out, ss, lse_s.narrow(0, start, len).unsqueeze(-1));
        out.exp_();  // q
        torch::Tensor p = (scaled(tr.narrow(0, start, len), temperature) -
                           lse_t.narrow(0, start, len).unsqueeze(-1))
                              .exp_();
        if (with_ce) {  // (q - p) kd + (q - onehot) ce, with q at T = 1
          out.mul_(kd_c + c.unsqueeze(-1)).addcmul_(p, kd_c, -1);
          subtract_target_one_hot(out, c, hit.narrow(0, start, len),
                                  local_index.narrow(0, start, len));
        } else {
          out.sub_(p).mul_(kd_c);
        }
        continue;
      }
      torch::Tensor log_q = ss - lse_s.narrow(0, start, len).unsqueeze(-1);
      torch::Tensor tt = scaled(tr.narrow(0, start, len), temperature);
      if (threshold.numel() > 0)  // the same top-k teacher as in forward
        tt = tt.masked_fill(tt < threshold.narrow(0, start, len).unsqueeze(-1), -kInfinity);
      torch::Tensor log_p = tt - lse_t.narrow(0, start, len).unsqueeze(-1);
      torch::Tensor q = log_q.exp(), g;
      if (kind == LogitLoss::reverse_kl) {
        g = q * (log_q - log_p).sub_(per_token.narrow(0, start, len).unsqueeze(-1));
      } else {  // forward KL and soft cross-entropy share the gradient q - p
        g = q - log_p.exp_();
      }
      torch::mul_out(out, g, kd_c);
      if (with_ce) {
        torch::Tensor softmax =
            temperature == 1.0
                ? q
                : (sr.narrow(0, start, len) - lse_1.narrow(0, start, len).unsqueeze(-1)).exp_();
        out.addcmul_(softmax, c.unsqueeze(-1));
        subtract_target_one_hot(out, c, hit.narrow(0, start, len),
                                local_index.narrow(0, start, len));
      }
    }
    variable_list result(12);
    result[0] = grad;
    return result;
  }
};

}  // namespace

std::pair<torch::Tensor, torch::Tensor> logit_distillation_and_lm_sums(
    const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const LogitLossOptions& o,
    const layers::TensorParallel& tp) {
  const int64_t local = student.size(-1);
  const double scale = o.scale_by_t2 ? o.temperature * o.temperature : 1.0;
  if (o.teacher_top_k > 0 && o.kind == LogitLoss::reverse_kl)
    throw UserError(
        "distill.teacher_top_k: reverse_kl is undefined where a top-k teacher has "
        "zero probability; use forward_kl or soft_ce");
  torch::Tensor flat_targets =
      targets.defined() ? targets.reshape({-1}) : torch::zeros({0}, torch::kLong);
  torch::Tensor both = LogitDistillation::apply(
      student.reshape({-1, local}), teacher.detach().reshape({-1, local}),
      weight.reshape({-1}).to(student.scalar_type()), flat_targets, int64_t(tp.rank()) * local,
      vocab_size, int64_t(o.kind), o.temperature, scale, o.chunk_tokens, o.teacher_top_k, tp.group);
  return {both[0], both[1]};
}

torch::Tensor logit_distillation_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                                     const torch::Tensor& weight, int64_t vocab_size,
                                     const LogitLossOptions& o, const layers::TensorParallel& tp) {
  return logit_distillation_and_lm_sums(student, teacher, weight, torch::Tensor(), vocab_size, o,
                                        tp)
      .first;
}

}  // namespace retort::distill
