// distill/logit_losses.cpp: see logit_losses.h.
#include "distill/logit_losses.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>

#include "common/user_error.h"
#include "kernels/logit_kernels.h"
#include "layers/kernel_route.h"
#include "layers/linear_products.h"

namespace retort::distill {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

void tp_reduce(torch::Tensor& t, parallel::Communicator* group, parallel::ReduceOp op) {
  if (group->size() > 1) group->all_reduce(t, op);
}

// log-sum-exp over the split vocabulary of x [n, local]; a rank may hold no column at all
// (its whole slice is padding), and then contributes nothing.
torch::Tensor split_logsumexp(const torch::Tensor& x, parallel::Communicator* group) {
  if (group->size() == 1) return torch::logsumexp(x, -1);  // one fused kernel
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
  if (group->size() > 1) local = group->all_gather(local, 1);
  return std::get<0>(local.topk(k, 1)).select(1, k - 1).contiguous();
}

// What both forms of the logit loss share: its settings, and per token the statistics the
// forward computes and the backward reuses.
struct LossSetup {
  int64_t n = 0, local = 0, real = 0, vocab_start = 0;
  LogitLoss kind = LogitLoss::forward_kl;
  double temperature = 1, scale = 1;
  int64_t chunk = 1, top_k = 0;
  bool with_ce = false;
  parallel::Communicator* group = &parallel::Communicator::one_process();
  layers::HeadGradSink* sink = nullptr;  // the student head weight's gradient goes there
  // The same on every rank: the dense form needs a full teacher and p log p terms that vanish.
  bool dense() const { return top_k == 0 && kind != LogitLoss::reverse_kl; }
};

struct TokenStats {
  torch::Tensor lse_s, lse_t, lse_1, per_token, threshold, target_logit, local_index, hit;
};

TokenStats empty_stats(const LossSetup& L, const torch::Tensor& targets,
                       torch::TensorOptions options) {
  TokenStats st;
  st.threshold = torch::empty({L.top_k > 0 ? L.n : 0}, options);
  st.lse_s = torch::empty({L.n}, options);
  st.lse_t = torch::empty({L.n}, options);
  st.lse_1 = st.lse_s;  // log-sum-exp at T = 1, for the cross-entropy
  if (L.with_ce && L.temperature != 1.0) st.lse_1 = torch::empty({L.n}, options);
  st.per_token = torch::empty({L.n}, options);
  st.target_logit = torch::zeros({L.with_ce ? L.n : 0}, options);
  st.local_index = torch::zeros({0}, torch::kLong);
  st.hit = torch::zeros({0}, torch::kBool);
  if (L.with_ce) {  // real targets only ever hit real columns
    st.hit = (targets >= L.vocab_start) & (targets < L.vocab_start + L.real);
    st.local_index = torch::where(st.hit, targets - L.vocab_start, torch::zeros_like(targets));
  }
  return st;
}

// The one-pass loops (kernels/logit_kernels.h) take the dense losses where the dispatch routes
// the logits' device and dtype to them, on logits whose rows are contiguous, and with the
// cross-entropy only at T = 1, where its softmax is the logit loss's q. The choice depends on
// nothing rank-specific, so every rank of a TP group takes the same path and joins the same
// collectives.
bool loops_apply(const LossSetup& L, const torch::Tensor& sr, const torch::Tensor& tr) {
  const auto dtype = sr.scalar_type();
  auto rows_ready = [](const torch::Tensor& x) {
    return x.device().is_cpu() && x.dim() == 2 && (x.size(1) == 0 || x.stride(1) == 1);
  };
  return L.dense() && (!L.with_ce || L.temperature == 1.0) && rows_ready(sr) && rows_ready(tr) &&
         tr.scalar_type() == dtype && layers::runs_our_loops(kernels::Operation::logit_loss, sr);
}

template <typename T>
kernels::LogitRows<T> logit_rows(const LossSetup& L, const torch::Tensor& sr,
                                 const torch::Tensor& tr, int64_t begin, int64_t end) {
  kernels::LogitRows<T> x;
  x.s_stride = sr.stride(0);
  x.t_stride = tr.stride(0);
  x.s = sr.data_ptr<T>() + begin * x.s_stride;
  x.t = tr.data_ptr<T>() + begin * x.t_stride;
  x.rows = end - begin;
  x.cols = sr.size(1);
  x.inv_temperature = 1.0 / L.temperature;
  return x;
}

// What a run of the dense loop does with tokens [start, start + len) of the statistics.
enum class LoopPass {
  gradient,           // reads the saved log-sum-exps, writes the gradient
  split_forward,      // reads the log-sum-exps (combined over TP), writes each token's term
  whole_forward,      // this rank holds the whole vocabulary: forms the log-sum-exps too
  whole_and_gradient  // the same and the gradient, into sr itself (tr is scratch)
};

// Runs the dense loop over those tokens' rows sr, tr, split across torch's intra-op threads.
// The gradient (kd_c (q - p) + ce_c q) goes to grad, or to sr with whole_and_gradient, whose
// caller gives up both chunks of logits. Writes st's log-sum-exps and per-token terms through
// its tensor handles, so the gradient pass, which writes neither, can pass saved statistics.
void run_dense_loop(LoopPass pass, const LossSetup& L, const TokenStats& st,
                    const torch::Tensor& sr, const torch::Tensor& tr, int64_t start, int64_t len,
                    torch::Tensor grad = {}, const torch::Tensor& kd_c = {},
                    const torch::Tensor& ce_c = {}) {
  const bool in_place = pass == LoopPass::whole_and_gradient;
  if (in_place) grad = sr;
  AT_DISPATCH_FLOATING_TYPES(sr.scalar_type(), "dense_logit_loss", [&] {
    kernels::DenseKd<scalar_t> kd;
    kd.forward_kl = L.kind == LogitLoss::forward_kl;
    kd.whole_rows = pass == LoopPass::whole_forward || in_place;
    scalar_t* lse_s = st.lse_s.data_ptr<scalar_t>() + start;
    scalar_t* lse_t = st.lse_t.data_ptr<scalar_t>() + start;
    scalar_t* partial =
        pass == LoopPass::gradient ? nullptr : st.per_token.data_ptr<scalar_t>() + start;
    at::parallel_for(0, len, 4, [&](int64_t b, int64_t e) {
      kernels::DenseKd<scalar_t> rows = kd;
      rows.lse_s = lse_s + b;
      rows.lse_t = lse_t + b;
      rows.partial = partial ? partial + b : nullptr;
      if (grad.defined()) {
        rows.grad_stride = grad.stride(0);
        rows.grad = grad.data_ptr<scalar_t>() + b * rows.grad_stride;
        rows.kd_c = kd_c.data_ptr<scalar_t>() + start + b;
        if (L.with_ce) rows.ce_c = ce_c.data_ptr<scalar_t>() + start + b;
      }
      if (in_place) rows.scratch_t = tr.data_ptr<scalar_t>() + b * tr.stride(0);
      kernels::dense_kd_rows(logit_rows<scalar_t>(L, sr, tr, b, e), rows);
    });
  });
}

// The log-sum-exps of tokens [start, start + len) over the split vocabulary through the
// loops: each slice's row maxima and exp sums, combined over the TP group (two collectives for
// student and teacher together).
void split_logsumexps_by_loops(const LossSetup& L, TokenStats& st, const torch::Tensor& sr,
                               const torch::Tensor& tr, int64_t start, int64_t len) {
  torch::Tensor max = torch::empty({2, len}, sr.options()), sum = torch::empty_like(max);
  AT_DISPATCH_FLOATING_TYPES(sr.scalar_type(), "logit_row_stats", [&] {
    scalar_t *mp = max.data_ptr<scalar_t>(), *sp = sum.data_ptr<scalar_t>();
    at::parallel_for(0, len, 4, [&](int64_t b, int64_t e) {
      kernels::logit_row_stats(logit_rows<scalar_t>(L, sr, tr, b, e), mp + b, sp + b, mp + len + b,
                               sp + len + b);
    });
  });
  const double inv_t = 1.0 / L.temperature;
  torch::Tensor global = max.clone();
  tp_reduce(global, L.group, parallel::ReduceOp::Max);
  // A slice with no real column has max -inf and sum 0: it adds 0 * exp(-inf) = 0.
  sum.mul_(((max - global) * inv_t).exp_());
  tp_reduce(sum, L.group, parallel::ReduceOp::Sum);
  torch::Tensor lse = global.mul_(inv_t).add_(sum.log_());
  st.lse_s.narrow(0, start, len).copy_(lse[0]);
  st.lse_t.narrow(0, start, len).copy_(lse[1]);
}

// The cross-entropy's target logit of tokens [start, start + len) on this rank (0 where the
// target lies in another rank's slice).
void record_target_logits(const LossSetup& L, TokenStats& st, const torch::Tensor& sr,
                          int64_t start, int64_t len) {
  if (!L.with_ce || L.real == 0) return;
  torch::Tensor hit = st.hit.narrow(0, start, len);
  torch::Tensor index = st.local_index.narrow(0, start, len);
  st.target_logit.narrow(0, start, len)
      .copy_(torch::where(hit, sr.gather(1, index.unsqueeze(1)).squeeze(1),
                          torch::zeros({}, sr.options())));
}

// forward_chunk through the loops (loops_apply): the log-sum-exps (lse_1 is lse_s, T = 1 with
// the cross-entropy) and each token's partial loss.
void forward_chunk_by_loops(const LossSetup& L, TokenStats& st, const torch::Tensor& sr,
                            const torch::Tensor& tr, int64_t start, int64_t len) {
  const bool alone = !L.group || L.group->size() == 1;
  if (!alone) split_logsumexps_by_loops(L, st, sr, tr, start, len);
  run_dense_loop(alone ? LoopPass::whole_forward : LoopPass::split_forward, L, st, sr, tr, start,
                 len);
  record_target_logits(L, st, sr, start, len);
}

// The forward of tokens [start, start + len): sr, tr are their real student and teacher
// logit columns [len, real].
void forward_chunk(const LossSetup& L, TokenStats& st, const torch::Tensor& sr,
                   const torch::Tensor& tr, int64_t start, int64_t len) {
  if (loops_apply(L, sr, tr)) return forward_chunk_by_loops(L, st, sr, tr, start, len);
  torch::Tensor ss = scaled(sr, L.temperature), tt = scaled(tr, L.temperature);
  if (L.top_k > 0) {
    torch::Tensor th = st.threshold.narrow(0, start, len);
    th.copy_(top_k_threshold(tt, L.top_k, L.local, L.group));
    tt = tt.masked_fill(tt < th.unsqueeze(-1), -kInfinity);
  }
  st.lse_s.narrow(0, start, len).copy_(split_logsumexp(ss, L.group));
  st.lse_t.narrow(0, start, len).copy_(split_logsumexp(tt, L.group));
  if (L.with_ce && L.temperature != 1.0)
    st.lse_1.narrow(0, start, len).copy_(split_logsumexp(sr, L.group));
  record_target_logits(L, st, sr, start, len);
  if (L.dense()) {  // fewer passes: the log-sum-exps are added once after the reduction
    torch::Tensor p = (tt - st.lse_t.narrow(0, start, len).unsqueeze(-1)).exp_();
    st.per_token.narrow(0, start, len)
        .copy_(L.kind == LogitLoss::forward_kl ? (p * (tt - ss)).sum(-1) : -(p * ss).sum(-1));
    return;
  }
  torch::Tensor log_q = ss - st.lse_s.narrow(0, start, len).unsqueeze(-1);
  torch::Tensor log_p = tt - st.lse_t.narrow(0, start, len).unsqueeze(-1);
  st.per_token.narrow(0, start, len).copy_(partial_loss(L.kind, log_q, log_p, L.top_k > 0));
}

// After every chunk's forward: the TP sums and the two weighted totals [kd, ce].
torch::Tensor finish_forward(const LossSetup& L, TokenStats& st, const torch::Tensor& w) {
  tp_reduce(st.per_token, L.group, parallel::ReduceOp::Sum);
  // Dense forms: sum p (log p - log q) = sum p (t - s) + lse_s - lse_t and
  // -sum p log q = -sum p s + lse_s, because p sums to one over the whole vocabulary.
  if (L.dense()) st.per_token += L.kind == LogitLoss::forward_kl ? st.lse_s - st.lse_t : st.lse_s;
  torch::Tensor ce_sum = torch::zeros({}, w.options());
  if (L.with_ce) {
    tp_reduce(st.target_logit, L.group, parallel::ReduceOp::Sum);
    ce_sum = ((st.lse_1 - st.target_logit) * w).sum();
  }
  return torch::stack({(st.per_token * w).sum() * L.scale, ce_sum});
}

// d(loss)/d(real student logits) of tokens [start, start + len) into out [len, width]:
// (...) / T per token for the logit loss, softmax - one-hot for the cross-entropy. sr, tr,
// out hold the real columns [columns, columns + width) of the slice (all of them by default).
void gradient_chunk(const LossSetup& L, const TokenStats& st, torch::Tensor out,
                    const torch::Tensor& sr, const torch::Tensor& tr,
                    const torch::Tensor& kd_coefficient, const torch::Tensor& ce_coefficient,
                    int64_t start, int64_t len, int64_t columns = 0) {
  auto subtract_one_hot = [&](const torch::Tensor& c) {
    torch::Tensor hit = st.hit.narrow(0, start, len), index = st.local_index.narrow(0, start, len);
    if (columns > 0 || out.size(1) < L.real) {  // targets outside these columns: none
      hit = hit & (index >= columns) & (index < columns + out.size(1));
      index = torch::where(hit, index - columns, torch::zeros_like(index));
    }
    subtract_target_one_hot(out, c, hit, index);
  };
  if (loops_apply(L, sr, tr)) {  // q and p formed in one pass, from the saved statistics
    run_dense_loop(LoopPass::gradient, L, st, sr, tr, start, len, out, kd_coefficient,
                   ce_coefficient);
    if (L.with_ce) subtract_one_hot(ce_coefficient.narrow(0, start, len));
    return;
  }
  torch::Tensor ss = scaled(sr, L.temperature);
  torch::Tensor kd_c = kd_coefficient.narrow(0, start, len).unsqueeze(-1);
  torch::Tensor c = ce_coefficient.narrow(0, start, len);
  torch::Tensor lse_s = st.lse_s.narrow(0, start, len).unsqueeze(-1);
  torch::Tensor lse_t = st.lse_t.narrow(0, start, len).unsqueeze(-1);
  if (L.dense() && (!L.with_ce || L.temperature == 1.0)) {  // q and p written in place
    torch::sub_out(out, ss, lse_s);
    out.exp_();  // q
    torch::Tensor p = (scaled(tr, L.temperature) - lse_t).exp_();
    if (L.with_ce) {  // (q - p) kd + (q - onehot) ce, with q at T = 1
      out.mul_(kd_c + c.unsqueeze(-1)).addcmul_(p, kd_c, -1);
      subtract_one_hot(c);
    } else {
      out.sub_(p).mul_(kd_c);
    }
    return;
  }
  torch::Tensor log_q = ss - lse_s;
  torch::Tensor tt = scaled(tr, L.temperature);
  if (L.top_k > 0)  // the same top-k teacher as in forward
    tt = tt.masked_fill(tt < st.threshold.narrow(0, start, len).unsqueeze(-1), -kInfinity);
  torch::Tensor log_p = tt - lse_t;
  torch::Tensor q = log_q.exp(), g;
  if (L.kind == LogitLoss::reverse_kl) {
    g = q * (log_q - log_p).sub_(st.per_token.narrow(0, start, len).unsqueeze(-1));
  } else {  // forward KL and soft cross-entropy share the gradient q - p
    g = q - log_p.exp_();
  }
  torch::mul_out(out, g, kd_c);
  if (L.with_ce) {
    torch::Tensor softmax =
        L.temperature == 1.0 ? q : (sr - st.lse_1.narrow(0, start, len).unsqueeze(-1)).exp_();
    out.addcmul_(softmax, c.unsqueeze(-1));
    subtract_one_hot(c);
  }
}

void save_setup(AutogradContext* ctx, const LossSetup& L) {
  ctx->saved_data["n"] = L.n;
  ctx->saved_data["local"] = L.local;
  ctx->saved_data["real"] = L.real;
  ctx->saved_data["vocab_start"] = L.vocab_start;
  ctx->saved_data["kind"] = int64_t(L.kind);
  ctx->saved_data["temperature"] = L.temperature;
  ctx->saved_data["scale"] = L.scale;
  ctx->saved_data["chunk"] = L.chunk;
  ctx->saved_data["top_k"] = L.top_k;
  ctx->saved_data["with_ce"] = L.with_ce;
  ctx->saved_data["sink"] = reinterpret_cast<int64_t>(L.sink);
}

// The backward needs no communication (the top-k threshold is saved): no group.
LossSetup load_setup(AutogradContext* ctx) {
  LossSetup L;
  L.n = ctx->saved_data["n"].toInt();
  L.local = ctx->saved_data["local"].toInt();
  L.real = ctx->saved_data["real"].toInt();
  L.vocab_start = ctx->saved_data["vocab_start"].toInt();
  L.kind = LogitLoss(ctx->saved_data["kind"].toInt());
  L.temperature = ctx->saved_data["temperature"].toDouble();
  L.scale = ctx->saved_data["scale"].toDouble();
  L.chunk = ctx->saved_data["chunk"].toInt();
  L.top_k = ctx->saved_data["top_k"].toInt();
  L.with_ce = ctx->saved_data["with_ce"].toBool();
  L.sink = reinterpret_cast<layers::HeadGradSink*>(ctx->saved_data["sink"].toInt());
  return L;
}

void save_stats(std::vector<torch::Tensor>& saved, const TokenStats& st) {
  saved.insert(saved.end(),
               {st.lse_s, st.lse_t, st.lse_1, st.per_token, st.threshold, st.local_index, st.hit});
}

TokenStats load_stats(const std::vector<torch::Tensor>& saved, size_t first) {
  TokenStats st;
  st.lse_s = saved[first];
  st.lse_t = saved[first + 1];
  st.lse_1 = saved[first + 2];
  st.per_token = saved[first + 3];
  st.threshold = saved[first + 4];
  st.local_index = saved[first + 5];
  st.hit = saved[first + 6];
  return st;
}

// The per-token coefficients of the backward: d/ds of the logit loss is (...) / T per token.
std::pair<torch::Tensor, torch::Tensor> coefficients(const LossSetup& L, const torch::Tensor& w,
                                                     const torch::Tensor& grad_output) {
  return {grad_output[0] * w * (L.scale / L.temperature), grad_output[1] * w};
}

// The student head weight's whole gradient: to a sink that takes it whole (then autograd
// gets none), else returned for autograd.
torch::Tensor deliver_whole(layers::HeadGradSink* sink, const torch::Tensor& grad_w) {
  if (!sink || !grad_w.defined()) return grad_w;
  sink->take_rows(0, grad_w);
  return torch::Tensor();
}

// The student head weight's gradient, block of rows by block, into L.sink (padded rows as
// zeros): each block's student and teacher logits are formed again chunk of tokens by chunk
// and dropped. grad_x accumulates each block's part of d/d(student head input).
void stream_student_weight_grad(const LossSetup& L, const TokenStats& st, const torch::Tensor& xs,
                                const torch::Tensor& ws, const torch::Tensor& xt,
                                const torch::Tensor& wt, const torch::Tensor& kd_coefficient,
                                const torch::Tensor& ce_coefficient, torch::Tensor grad_x) {
  const int64_t block = std::max<int64_t>(1, L.sink->block_rows(L.local));
  // A block of rows is a fraction of the slice, so proportionally more tokens per chunk keep
  // a chunk's logits at the size of the other forms' while the block's gradient is
  // accumulated (read and written whole) fewer times.
  const int64_t chunk = L.chunk * std::max<int64_t>(1, L.local / block);
  for (int64_t row = 0; row < L.local; row += block) {
    const int64_t rows = std::min(block, L.local - row);
    const int64_t real = std::clamp<int64_t>(L.real - row, 0, rows);
    torch::Tensor grad = torch::zeros({rows, ws.size(1)}, ws.options());
    if (real > 0) {
      torch::Tensor wsb = ws.narrow(0, row, real), wtb = wt.narrow(0, row, real);
      torch::Tensor grad_real = grad.narrow(0, 0, real);
      for (int64_t start = 0; start < L.n; start += chunk) {
        const int64_t len = std::min(chunk, L.n - start);
        torch::Tensor xs_c = xs.narrow(0, start, len);
        torch::Tensor out = torch::empty({len, real}, xs.options());
        gradient_chunk(L, st, out, torch::matmul(xs_c, wsb.t()),
                       torch::matmul(xt.narrow(0, start, len), wtb.t()), kd_coefficient,
                       ce_coefficient, start, len, row);
        grad_real.addmm_(out.t(), xs_c);
        grad_x.narrow(0, start, len).addmm_(out, wsb);
      }
    }
    L.sink->take_rows(row, grad);
  }
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
                               torch::Tensor w, torch::Tensor targets, LossSetup L) {
    TokenStats st = empty_stats(L, targets, s.options());
    torch::Tensor sr = s.narrow(1, 0, L.real), tr = t.narrow(1, 0, L.real);
    for (int64_t start = 0; start < L.n; start += L.chunk) {
      const int64_t len = std::min(L.chunk, L.n - start);
      forward_chunk(L, st, sr.narrow(0, start, len), tr.narrow(0, start, len), start, len);
    }
    torch::Tensor result = finish_forward(L, st, w);
    std::vector<torch::Tensor> saved = {s, t, w};
    save_stats(saved, st);
    ctx->save_for_backward(saved);
    save_setup(ctx, L);
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const LossSetup L = load_setup(ctx);
    torch::Tensor s = saved[0], t = saved[1], w = saved[2];
    const TokenStats st = load_stats(saved, 3);
    auto [kd_coefficient, ce_coefficient] = coefficients(L, w, grad_outputs[0]);
    // Padded columns keep a zero gradient; the real ones are all written below.
    torch::Tensor grad = L.real < L.local ? torch::zeros_like(s) : torch::empty_like(s);
    torch::Tensor sr = s.narrow(1, 0, L.real), tr = t.narrow(1, 0, L.real);
    torch::Tensor grad_real = grad.narrow(1, 0, L.real);
    for (int64_t start = 0; start < L.n; start += L.chunk) {
      const int64_t len = std::min(L.chunk, L.n - start);
      gradient_chunk(L, st, grad_real.narrow(0, start, len), sr.narrow(0, start, len),
                     tr.narrow(0, start, len), kd_coefficient, ce_coefficient, start, len);
    }
    variable_list result(5);
    result[0] = grad;
    return result;
  }
};

// The same loss with both LM heads fused in: the logits of a chunk of tokens are computed
// from the heads' inputs when needed (forward, and again in backward) and never kept, and
// backward returns the gradients of the student head's input and weight. For activation
// checkpointing: what stays from forward to backward is the two head inputs and per-token
// statistics, not [tokens, vocab] logits.
struct HeadLogitDistillation : torch::autograd::Function<HeadLogitDistillation> {
  // xs [n, hs], ws [local, hs]; xt [n, ht], wt [local, ht]; w: [n]; targets: [n] or empty.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor xs, torch::Tensor ws,
                               torch::Tensor xt, torch::Tensor wt, torch::Tensor w,
                               torch::Tensor targets, LossSetup L) {
    TokenStats st = empty_stats(L, targets, xs.options());
    torch::Tensor wsr = ws.narrow(0, 0, L.real), wtr = wt.narrow(0, 0, L.real);
    for (int64_t start = 0; start < L.n; start += L.chunk) {
      const int64_t len = std::min(L.chunk, L.n - start);
      forward_chunk(L, st, torch::matmul(xs.narrow(0, start, len), wsr.t()),
                    torch::matmul(xt.narrow(0, start, len), wtr.t()), start, len);
    }
    torch::Tensor result = finish_forward(L, st, w);
    std::vector<torch::Tensor> saved = {xs, ws, xt, wt, w};
    save_stats(saved, st);
    ctx->save_for_backward(saved);
    save_setup(ctx, L);
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const LossSetup L = load_setup(ctx);
    torch::Tensor xs = saved[0], ws = saved[1], xt = saved[2], wt = saved[3], w = saved[4];
    const TokenStats st = load_stats(saved, 5);
    auto [kd_coefficient, ce_coefficient] = coefficients(L, w, grad_outputs[0]);
    variable_list result(7);
    if (L.sink && L.sink->streams() && ws.requires_grad()) {  // the weight's rows go there
      result[0] = torch::zeros_like(xs);
      stream_student_weight_grad(L, st, xs, ws, xt, wt, kd_coefficient, ce_coefficient, result[0]);
      return result;
    }
    torch::Tensor wsr = ws.narrow(0, 0, L.real), wtr = wt.narrow(0, 0, L.real);
    torch::Tensor grad_x = torch::empty_like(xs);
    torch::Tensor grad_w = layers::zeroed_whole_gradient(L.sink, ws);  // padded rows stay 0
    torch::Tensor grad_w_real = grad_w.narrow(0, 0, L.real);
    for (int64_t start = 0; start < L.n; start += L.chunk) {
      const int64_t len = std::min(L.chunk, L.n - start);
      torch::Tensor xs_c = xs.narrow(0, start, len);
      torch::Tensor out = torch::empty({len, L.real}, xs.options());
      gradient_chunk(L, st, out, torch::matmul(xs_c, wsr.t()),
                     torch::matmul(xt.narrow(0, start, len), wtr.t()), kd_coefficient,
                     ce_coefficient, start, len);
      grad_x.narrow(0, start, len).copy_(torch::matmul(out, wsr));
      grad_w_real.addmm_(out.t(), xs_c);
    }
    result[0] = grad_x;
    result[1] = deliver_whole(L.sink, grad_w);
    return result;
  }
};

// The same loss with both heads fused in and its gradient formed in forward: each chunk's
// logits exist only while the chunk is processed, its per-token loss is made whole over TP
// at once, and the gradient of kd_factor * kd + ce_factor * ce with respect to the student
// head's input and weight accumulates chunk by chunk; backward scales it by the incoming
// gradient (in place). Outputs: that total (differentiable), and kd and ce (not).
struct FusedHeadLogitDistillation : torch::autograd::Function<FusedHeadLogitDistillation> {
  static variable_list forward(AutogradContext* ctx, torch::Tensor xs, torch::Tensor ws,
                               torch::Tensor xt, torch::Tensor wt, torch::Tensor w,
                               torch::Tensor targets, LossSetup L, double kd_factor,
                               double ce_factor) {
    TokenStats st = empty_stats(L, targets, xs.options());
    torch::Tensor wsr = ws.narrow(0, 0, L.real), wtr = wt.narrow(0, 0, L.real);
    TORCH_CHECK(!L.sink || !L.sink->streams(),
                "the fused logit loss forms the weight's gradient in forward: no streaming sink");
    const bool want_x = xs.requires_grad(), want_w = ws.requires_grad();
    torch::Tensor grad_x = want_x ? torch::empty_like(xs) : torch::Tensor();
    torch::Tensor grad_w = want_w ? layers::zeroed_whole_gradient(L.sink, ws) : torch::Tensor();
    auto [kd_coefficient, ce_coefficient] =
        coefficients(L, w, torch::tensor({kd_factor, ce_factor}, torch::dtype(w.scalar_type())));
    for (int64_t start = 0; start < L.n; start += L.chunk) {
      const int64_t len = std::min(L.chunk, L.n - start);
      torch::Tensor xs_c = xs.narrow(0, start, len);
      // Both heads' logits and the input gradient through the engine's own products where
      // they beat the BLAS (layers/linear_products.h), as the LM-only head forms its own.
      torch::Tensor sr = layers::product_by_transposed(xs_c, wsr);
      torch::Tensor tr = layers::product_by_transposed(xt.narrow(0, start, len), wtr);
      torch::Tensor out;
      const bool alone = !L.group || L.group->size() == 1;
      if (alone && loops_apply(L, sr, tr) && (want_x || want_w)) {
        // Loss and gradient in one loop, the gradient replacing the student's logits (their
        // target logits read first) and the teacher's as scratch: two chunks of [len, real].
        record_target_logits(L, st, sr, start, len);
        run_dense_loop(LoopPass::whole_and_gradient, L, st, sr, tr, start, len, {}, kd_coefficient,
                       ce_coefficient);
        out = sr;
        if (L.with_ce)
          subtract_target_one_hot(out, ce_coefficient.narrow(0, start, len),
                                  st.hit.narrow(0, start, len),
                                  st.local_index.narrow(0, start, len));
      } else {
        forward_chunk(L, st, sr, tr, start, len);
      }
      // This chunk's per-token loss (and target logits) whole over TP now: its gradient
      // needs them.
      torch::Tensor per_token = st.per_token.narrow(0, start, len);
      tp_reduce(per_token, L.group, parallel::ReduceOp::Sum);
      if (L.dense()) {
        torch::Tensor lse_s = st.lse_s.narrow(0, start, len);
        per_token +=
            L.kind == LogitLoss::forward_kl ? lse_s - st.lse_t.narrow(0, start, len) : lse_s;
      }
      if (L.with_ce) {
        torch::Tensor target_logit = st.target_logit.narrow(0, start, len);
        tp_reduce(target_logit, L.group, parallel::ReduceOp::Sum);
      }
      if (!want_x && !want_w) continue;
      if (!out.defined()) {
        out = torch::empty({len, L.real}, xs.options());
        gradient_chunk(L, st, out, sr, tr, kd_coefficient, ce_coefficient, start, len);
      }
      if (want_x) {  // written in place: grad_x rows are contiguous
        torch::Tensor rows = grad_x.narrow(0, start, len);
        layers::product_by_out(rows, out, wsr);
      }
      if (want_w) grad_w.narrow(0, 0, L.real).addmm_(out.t(), xs_c);
    }
    torch::Tensor kd = (st.per_token * w).sum() * L.scale;
    torch::Tensor ce =
        L.with_ce ? ((st.lse_1 - st.target_logit) * w).sum() : torch::zeros({}, w.options());
    torch::Tensor total = kd * kd_factor + ce * ce_factor;
    ctx->save_for_backward({grad_x, grad_w});
    ctx->saved_data["sink"] = reinterpret_cast<int64_t>(L.sink);
    ctx->mark_non_differentiable({kd, ce});
    return {total, kd, ce};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& g = grad_outputs[0];
    variable_list result(9);
    if (saved[0].defined()) result[0] = saved[0].mul_(g);  // ours alone: scaled in place
    auto* sink = reinterpret_cast<layers::HeadGradSink*>(ctx->saved_data["sink"].toInt());
    if (saved[1].defined()) result[1] = deliver_whole(sink, saved[1].mul_(g));
    return result;
  }
};

LossSetup make_setup(int64_t n, int64_t local, const torch::Tensor& targets, int64_t vocab_size,
                     const LogitLossOptions& o, const layers::TensorParallel& tp) {
  if (o.teacher_top_k > 0 && o.kind == LogitLoss::reverse_kl)
    throw UserError(
        "distill.teacher_top_k: reverse_kl is undefined where a top-k teacher has "
        "zero probability; use forward_kl or soft_ce");
  LossSetup L;
  L.n = n;
  L.local = local;
  L.vocab_start = int64_t(tp.rank()) * local;
  L.real = std::clamp<int64_t>(vocab_size - L.vocab_start, 0, local);
  L.kind = o.kind;
  L.temperature = o.temperature;
  L.scale = o.scale_by_t2 ? o.temperature * o.temperature : 1.0;
  L.chunk = o.chunk_tokens;
  L.top_k = o.teacher_top_k;
  L.with_ce = targets.defined() && targets.numel() > 0;
  L.group = tp.group;
  return L;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> logit_distillation_and_lm_sums(
    const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const LogitLossOptions& o,
    const layers::TensorParallel& tp) {
  const int64_t local = student.size(-1);
  torch::Tensor flat_targets =
      targets.defined() ? targets.reshape({-1}) : torch::zeros({0}, torch::kLong);
  const LossSetup setup =
      make_setup(student.numel() / local, local, flat_targets, vocab_size, o, tp);
  torch::Tensor both =
      LogitDistillation::apply(student.reshape({-1, local}), teacher.detach().reshape({-1, local}),
                               weight.reshape({-1}).to(student.scalar_type()), flat_targets, setup);
  return {both[0], both[1]};
}

std::pair<torch::Tensor, torch::Tensor> logit_distillation_and_lm_sums_from_heads(
    const HeadInput& student, const HeadInput& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const LogitLossOptions& o,
    const layers::TensorParallel& tp) {
  const int64_t local = student.weight.size(0);
  TORCH_CHECK(teacher.weight.size(0) == local, "student and teacher vocabulary slices differ");
  torch::Tensor xs = student.input.reshape({-1, student.input.size(-1)});
  torch::Tensor flat_targets =
      targets.defined() ? targets.reshape({-1}) : torch::zeros({0}, torch::kLong);
  LossSetup setup = make_setup(xs.size(0), local, flat_targets, vocab_size, o, tp);
  setup.sink = student.weight_grad_sink;
  torch::Tensor both = HeadLogitDistillation::apply(
      xs, student.weight, teacher.input.detach().reshape({-1, teacher.input.size(-1)}),
      teacher.weight.detach(), weight.reshape({-1}).to(xs.scalar_type()), flat_targets, setup);
  return {both[0], both[1]};
}

FusedLogitLoss logit_distillation_total_from_heads(
    const HeadInput& student, const HeadInput& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const LogitLossOptions& o,
    const layers::TensorParallel& tp, double kd_factor, double ce_factor) {
  const int64_t local = student.weight.size(0);
  TORCH_CHECK(teacher.weight.size(0) == local, "student and teacher vocabulary slices differ");
  torch::Tensor xs = student.input.reshape({-1, student.input.size(-1)});
  torch::Tensor flat_targets =
      targets.defined() ? targets.reshape({-1}) : torch::zeros({0}, torch::kLong);
  LossSetup setup = make_setup(xs.size(0), local, flat_targets, vocab_size, o, tp);
  setup.sink = student.weight_grad_sink;  // one that takes the gradient whole, if any
  torch::Tensor xt = teacher.input.detach().reshape({-1, teacher.input.size(-1)});
  torch::Tensor w = weight.reshape({-1}).to(xs.scalar_type());
  variable_list out;
  if (torch::GradMode::is_enabled()) {
    out = FusedHeadLogitDistillation::apply(xs, student.weight, xt, teacher.weight.detach(), w,
                                            flat_targets, setup, kd_factor, ce_factor);
  } else {  // nothing to differentiate: the same forward, no gradients formed
    AutogradContext unused;
    out = FusedHeadLogitDistillation::forward(&unused, xs.detach(), student.weight.detach(), xt,
                                              teacher.weight.detach(), w, flat_targets, setup,
                                              kd_factor, ce_factor);
  }
  return {out[0], out[1], out[2]};
}

torch::Tensor logit_distillation_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                                     const torch::Tensor& weight, int64_t vocab_size,
                                     const LogitLossOptions& o, const layers::TensorParallel& tp) {
  return logit_distillation_and_lm_sums(student, teacher, weight, torch::Tensor(), vocab_size, o,
                                        tp)
      .first;
}

}  // namespace retort::distill
