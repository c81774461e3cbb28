// distill/logit_losses.cpp: see logit_losses.h.
#include "distill/logit_losses.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>

#include "common/saved_object.h"
#include "common/user_error.h"
#include "distill/formed_gradients.h"
#include "distill/split_vocabulary.h"
#include "kernels/logit_kernels.h"
#include "layers/accumulation_type.h"
#include "layers/compute_copy.h"
#include "layers/kernel_route.h"
#include "layers/linear_products.h"
#include "layers/widened_products.h"

namespace retort::distill {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// A chunk's logits x @ weight^T in the type the loss is taken in: float32 for 16-bit heads
// (layers/accumulation_type.h), whose products alone run in 16 bits.
torch::Tensor chunk_logits(const torch::Tensor& x, const torch::Tensor& weight) {
  return layers::matmul_widening(x, weight.t()).to(layers::accumulation_type(x));
}
// A buffer for a chunk's logit gradient, in that type.
torch::Tensor gradient_buffer(int64_t len, int64_t columns, const torch::Tensor& x) {
  return torch::empty({len, columns}, x.options().dtype(layers::accumulation_type(x)));
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
  return split_top_k(tt, k, padded_local, 0, group).values.select(1, k - 1).contiguous();
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
  layers::RunContext* run = nullptr;     // the run's kernel mode, compute copies, gradient memory
  // The same on every rank: the dense form needs a full teacher and p log p terms that vanish.
  bool dense() const { return top_k == 0 && kind != LogitLoss::reverse_kl; }
};

struct TokenStats {
  torch::Tensor lse_s, lse_t, lse_1, per_token, threshold, target_logit, local_index, hit;
};

TokenStats empty_stats(const LossSetup& setup, const torch::Tensor& targets,
                       torch::TensorOptions options) {
  TokenStats stats;
  stats.threshold = torch::empty({setup.top_k > 0 ? setup.n : 0}, options);
  stats.lse_s = torch::empty({setup.n}, options);
  stats.lse_t = torch::empty({setup.n}, options);
  stats.lse_1 = stats.lse_s;  // log-sum-exp at T = 1, for the cross-entropy
  if (setup.with_ce && setup.temperature != 1.0) stats.lse_1 = torch::empty({setup.n}, options);
  stats.per_token = torch::empty({setup.n}, options);
  stats.target_logit = torch::zeros({setup.with_ce ? setup.n : 0}, options);
  stats.local_index = torch::zeros({0}, torch::kLong);
  stats.hit = torch::zeros({0}, torch::kBool);
  if (setup.with_ce) {  // real targets only ever hit real columns
    stats.hit = (targets >= setup.vocab_start) & (targets < setup.vocab_start + setup.real);
    stats.local_index =
        torch::where(stats.hit, targets - setup.vocab_start, torch::zeros_like(targets));
  }
  return stats;
}

// The one-pass loops (kernels/logit_kernels.h) take the dense losses where the dispatch routes
// the logits' device and dtype to them, on logits whose rows are contiguous, and with the
// cross-entropy only at T = 1, where its softmax is the logit loss's q. The choice depends on
// nothing rank-specific, so every rank of a TP group takes the same path and joins the same
// collectives.
bool loops_apply(const LossSetup& setup, const torch::Tensor& student_rows,
                 const torch::Tensor& teacher_rows) {
  const auto dtype = student_rows.scalar_type();
  auto rows_ready = [](const torch::Tensor& x) {
    return x.device().is_cpu() && x.dim() == 2 && (x.size(1) == 0 || x.stride(1) == 1);
  };
  return setup.dense() && (!setup.with_ce || setup.temperature == 1.0) &&
         rows_ready(student_rows) && rows_ready(teacher_rows) &&
         teacher_rows.scalar_type() == dtype &&
         layers::runs_our_loops(layers::mode_of(setup.run), kernels::Operation::logit_loss,
                                student_rows);
}

template <typename T>
kernels::LogitRows<T> logit_rows(const LossSetup& setup, const torch::Tensor& student_rows,
                                 const torch::Tensor& teacher_rows, int64_t begin, int64_t end) {
  kernels::LogitRows<T> x;
  x.s_stride = student_rows.stride(0);
  x.t_stride = teacher_rows.stride(0);
  x.s = student_rows.data_ptr<T>() + begin * x.s_stride;
  x.t = teacher_rows.data_ptr<T>() + begin * x.t_stride;
  x.rows = end - begin;
  x.cols = student_rows.size(1);
  x.inv_temperature = 1.0 / setup.temperature;
  return x;
}

// What a run of the dense loop does with tokens [start, start + len) of the statistics.
enum class LoopPass {
  gradient,           // reads the saved log-sum-exps, writes the gradient
  split_forward,      // reads the log-sum-exps (combined over TP), writes each token's term
  whole_forward,      // this rank holds the whole vocabulary: forms the log-sum-exps too
  whole_and_gradient  // the same and the gradient, into student_rows itself (teacher_rows is
                      // scratch)
};

// Runs the dense loop over those tokens' rows student_rows, teacher_rows, split across torch's
// intra-op threads. The gradient (kd_c (q - p) + ce_c q) goes to grad, or to student_rows with
// whole_and_gradient, whose caller gives up both chunks of logits. Writes stats's log-sum-exps and
// per-token terms through its tensor handles, so the gradient pass, which writes neither, can pass
// saved statistics.
void run_dense_loop(LoopPass pass, const LossSetup& setup, const TokenStats& stats,
                    const torch::Tensor& student_rows, const torch::Tensor& teacher_rows,
                    int64_t start, int64_t len, torch::Tensor grad = {},
                    const torch::Tensor& kd_c = {}, const torch::Tensor& ce_c = {}) {
  const bool in_place = pass == LoopPass::whole_and_gradient;
  if (in_place) grad = student_rows;
  AT_DISPATCH_FLOATING_TYPES(student_rows.scalar_type(), "dense_logit_loss", [&] {
    kernels::DenseKd<scalar_t> kd;
    kd.forward_kl = setup.kind == LogitLoss::forward_kl;
    kd.whole_rows = pass == LoopPass::whole_forward || in_place;
    scalar_t* lse_s = stats.lse_s.data_ptr<scalar_t>() + start;
    scalar_t* lse_t = stats.lse_t.data_ptr<scalar_t>() + start;
    scalar_t* partial =
        pass == LoopPass::gradient ? nullptr : stats.per_token.data_ptr<scalar_t>() + start;
    at::parallel_for(0, len, 4, [&](int64_t b, int64_t e) {
      kernels::DenseKd<scalar_t> rows = kd;
      rows.lse_s = lse_s + b;
      rows.lse_t = lse_t + b;
      rows.partial = partial ? partial + b : nullptr;
      if (grad.defined()) {
        rows.grad_stride = grad.stride(0);
        rows.grad = grad.data_ptr<scalar_t>() + b * rows.grad_stride;
        rows.kd_c = kd_c.data_ptr<scalar_t>() + start + b;
        if (setup.with_ce) rows.ce_c = ce_c.data_ptr<scalar_t>() + start + b;
      }
      if (in_place) rows.scratch_t = teacher_rows.data_ptr<scalar_t>() + b * teacher_rows.stride(0);
      kernels::dense_kd_rows(logit_rows<scalar_t>(setup, student_rows, teacher_rows, b, e), rows);
    });
  });
}

// The log-sum-exps of tokens [start, start + len) over the split vocabulary through the
// loops: each slice's row maxima and exp sums, combined over the TP group (two collectives for
// student and teacher together).
void split_logsumexps_by_loops(const LossSetup& setup, TokenStats& stats,
                               const torch::Tensor& student_rows, const torch::Tensor& teacher_rows,
                               int64_t start, int64_t len) {
  torch::Tensor max = torch::empty({2, len}, student_rows.options()), sum = torch::empty_like(max);
  AT_DISPATCH_FLOATING_TYPES(student_rows.scalar_type(), "logit_row_stats", [&] {
    scalar_t *mp = max.data_ptr<scalar_t>(), *sp = sum.data_ptr<scalar_t>();
    at::parallel_for(0, len, 4, [&](int64_t b, int64_t e) {
      kernels::logit_row_stats(logit_rows<scalar_t>(setup, student_rows, teacher_rows, b, e),
                               mp + b, sp + b, mp + len + b, sp + len + b);
    });
  });
  const double inv_t = 1.0 / setup.temperature;
  torch::Tensor global = max.clone();
  tp_reduce(global, setup.group, parallel::ReduceOp::Max);
  // A slice with no real column has max -inf and sum 0: it adds 0 * exp(-inf) = 0.
  sum.mul_(((max - global) * inv_t).exp_());
  tp_reduce(sum, setup.group, parallel::ReduceOp::Sum);
  torch::Tensor lse = global.mul_(inv_t).add_(sum.log_());
  stats.lse_s.narrow(0, start, len).copy_(lse[0]);
  stats.lse_t.narrow(0, start, len).copy_(lse[1]);
}

// The cross-entropy's target logit of tokens [start, start + len) on this rank (0 where the
// target lies in another rank's slice).
void record_target_logits(const LossSetup& setup, TokenStats& stats,
                          const torch::Tensor& student_rows, int64_t start, int64_t len) {
  if (!setup.with_ce || setup.real == 0) return;
  torch::Tensor hit = stats.hit.narrow(0, start, len);
  torch::Tensor index = stats.local_index.narrow(0, start, len);
  stats.target_logit.narrow(0, start, len)
      .copy_(torch::where(hit, student_rows.gather(1, index.unsqueeze(1)).squeeze(1),
                          torch::zeros({}, student_rows.options())));
}

// forward_chunk through the loops (loops_apply): the log-sum-exps (lse_1 is lse_s, T = 1 with
// the cross-entropy) and each token's partial loss.
void forward_chunk_by_loops(const LossSetup& setup, TokenStats& stats,
                            const torch::Tensor& student_rows, const torch::Tensor& teacher_rows,
                            int64_t start, int64_t len) {
  const bool alone = !setup.group || setup.group->size() == 1;
  if (!alone) split_logsumexps_by_loops(setup, stats, student_rows, teacher_rows, start, len);
  run_dense_loop(alone ? LoopPass::whole_forward : LoopPass::split_forward, setup, stats,
                 student_rows, teacher_rows, start, len);
  record_target_logits(setup, stats, student_rows, start, len);
}

// The forward of tokens [start, start + len): student_rows, teacher_rows are their real student and
// teacher logit columns [len, real].
void forward_chunk(const LossSetup& setup, TokenStats& stats, const torch::Tensor& student_rows,
                   const torch::Tensor& teacher_rows, int64_t start, int64_t len) {
  if (loops_apply(setup, student_rows, teacher_rows))
    return forward_chunk_by_loops(setup, stats, student_rows, teacher_rows, start, len);
  torch::Tensor ss = scaled(student_rows, setup.temperature),
                tt = scaled(teacher_rows, setup.temperature);
  if (setup.top_k > 0) {
    torch::Tensor th = stats.threshold.narrow(0, start, len);
    th.copy_(top_k_threshold(tt, setup.top_k, setup.local, setup.group));
    tt = tt.masked_fill(tt < th.unsqueeze(-1), -kInfinity);
  }
  stats.lse_s.narrow(0, start, len).copy_(split_logsumexp(ss, setup.group));
  stats.lse_t.narrow(0, start, len).copy_(split_logsumexp(tt, setup.group));
  if (setup.with_ce && setup.temperature != 1.0)
    stats.lse_1.narrow(0, start, len).copy_(split_logsumexp(student_rows, setup.group));
  record_target_logits(setup, stats, student_rows, start, len);
  if (setup.dense()) {  // fewer passes: the log-sum-exps are added once after the reduction
    torch::Tensor p = (tt - stats.lse_t.narrow(0, start, len).unsqueeze(-1)).exp_();
    stats.per_token.narrow(0, start, len)
        .copy_(setup.kind == LogitLoss::forward_kl ? (p * (tt - ss)).sum(-1) : -(p * ss).sum(-1));
    return;
  }
  torch::Tensor log_q = ss - stats.lse_s.narrow(0, start, len).unsqueeze(-1);
  torch::Tensor log_p = tt - stats.lse_t.narrow(0, start, len).unsqueeze(-1);
  stats.per_token.narrow(0, start, len)
      .copy_(partial_loss(setup.kind, log_q, log_p, setup.top_k > 0));
}

// After every chunk's forward: the TP sums and the two weighted totals [kd, ce].
torch::Tensor finish_forward(const LossSetup& setup, TokenStats& stats, const torch::Tensor& w) {
  tp_reduce(stats.per_token, setup.group, parallel::ReduceOp::Sum);
  // Dense forms: sum p (log p - log q) = sum p (t - s) + lse_s - lse_t and
  // -sum p log q = -sum p s + lse_s, because p sums to one over the whole vocabulary.
  if (setup.dense())
    stats.per_token +=
        setup.kind == LogitLoss::forward_kl ? stats.lse_s - stats.lse_t : stats.lse_s;
  torch::Tensor ce_sum = torch::zeros({}, w.options());
  if (setup.with_ce) {
    tp_reduce(stats.target_logit, setup.group, parallel::ReduceOp::Sum);
    ce_sum = ((stats.lse_1 - stats.target_logit) * w).sum();
  }
  return torch::stack({(stats.per_token * w).sum() * setup.scale, ce_sum});
}

// d(loss)/d(real student logits) of tokens [start, start + len) into out [len, width]:
// (...) / T per token for the logit loss, softmax - one-hot for the cross-entropy. student_rows,
// teacher_rows, out hold the real columns [columns, columns + width) of the slice (all of them by
// default).
void gradient_chunk(const LossSetup& setup, const TokenStats& stats, torch::Tensor out,
                    const torch::Tensor& student_rows, const torch::Tensor& teacher_rows,
                    const torch::Tensor& kd_coefficient, const torch::Tensor& ce_coefficient,
                    int64_t start, int64_t len, int64_t columns = 0) {
  auto subtract_one_hot = [&](const torch::Tensor& c) {
    torch::Tensor hit = stats.hit.narrow(0, start, len),
                  index = stats.local_index.narrow(0, start, len);
    if (columns > 0 || out.size(1) < setup.real) {  // targets outside these columns: none
      hit = hit & (index >= columns) & (index < columns + out.size(1));
      index = torch::where(hit, index - columns, torch::zeros_like(index));
    }
    subtract_target_one_hot(out, c, hit, index);
  };
  if (loops_apply(setup, student_rows,
                  teacher_rows)) {  // q and p formed in one pass, from the saved statistics
    run_dense_loop(LoopPass::gradient, setup, stats, student_rows, teacher_rows, start, len, out,
                   kd_coefficient, ce_coefficient);
    if (setup.with_ce) subtract_one_hot(ce_coefficient.narrow(0, start, len));
    return;
  }
  torch::Tensor ss = scaled(student_rows, setup.temperature);
  torch::Tensor kd_c = kd_coefficient.narrow(0, start, len).unsqueeze(-1);
  torch::Tensor c = ce_coefficient.narrow(0, start, len);
  torch::Tensor lse_s = stats.lse_s.narrow(0, start, len).unsqueeze(-1);
  torch::Tensor lse_t = stats.lse_t.narrow(0, start, len).unsqueeze(-1);
  if (setup.dense() && (!setup.with_ce || setup.temperature == 1.0)) {  // q and p written in place
    torch::sub_out(out, ss, lse_s);
    out.exp_();  // q
    torch::Tensor p = (scaled(teacher_rows, setup.temperature) - lse_t).exp_();
    if (setup.with_ce) {  // (q - p) kd + (q - onehot) ce, with q at T = 1
      out.mul_(kd_c + c.unsqueeze(-1)).addcmul_(p, kd_c, -1);
      subtract_one_hot(c);
    } else {
      out.sub_(p).mul_(kd_c);
    }
    return;
  }
  torch::Tensor log_q = ss - lse_s;
  torch::Tensor tt = scaled(teacher_rows, setup.temperature);
  if (setup.top_k > 0)  // the same top-k teacher as in forward
    tt = tt.masked_fill(tt < stats.threshold.narrow(0, start, len).unsqueeze(-1), -kInfinity);
  torch::Tensor log_p = tt - lse_t;
  torch::Tensor q = log_q.exp(), g;
  if (setup.kind == LogitLoss::reverse_kl) {
    g = q * (log_q - log_p).sub_(stats.per_token.narrow(0, start, len).unsqueeze(-1));
  } else {  // forward KL and soft cross-entropy share the gradient q - p
    g = q - log_p.exp_();
  }
  torch::mul_out(out, g, kd_c);
  if (setup.with_ce) {
    torch::Tensor softmax =
        setup.temperature == 1.0
            ? q
            : (student_rows - stats.lse_1.narrow(0, start, len).unsqueeze(-1)).exp_();
    out.addcmul_(softmax, c.unsqueeze(-1));
    subtract_one_hot(c);
  }
}

void save_stats(std::vector<torch::Tensor>& saved, const TokenStats& stats) {
  saved.insert(saved.end(), {stats.lse_s, stats.lse_t, stats.lse_1, stats.per_token,
                             stats.threshold, stats.local_index, stats.hit});
}

TokenStats load_stats(const std::vector<torch::Tensor>& saved, size_t first) {
  TokenStats stats;
  stats.lse_s = saved[first];
  stats.lse_t = saved[first + 1];
  stats.lse_1 = saved[first + 2];
  stats.per_token = saved[first + 3];
  stats.threshold = saved[first + 4];
  stats.local_index = saved[first + 5];
  stats.hit = saved[first + 6];
  return stats;
}

// The per-token coefficients of the backward: d/ds of the logit loss is (...) / T per token.
std::pair<torch::Tensor, torch::Tensor> coefficients(const LossSetup& setup, const torch::Tensor& w,
                                                     const torch::Tensor& grad_output) {
  return {grad_output[0] * w * (setup.scale / setup.temperature), grad_output[1] * w};
}

// The student head weight's gradient, block of rows by block, into setup.sink (padded rows as
// zeros): each block's student and teacher logits are formed again chunk of tokens by chunk
// and dropped. grad_x accumulates each block's part of d/d(student head input).
void stream_student_weight_grad(const LossSetup& setup, const TokenStats& stats,
                                const torch::Tensor& xs, const torch::Tensor& ws,
                                const torch::Tensor& xt, const torch::Tensor& wt,
                                const torch::Tensor& kd_coefficient,
                                const torch::Tensor& ce_coefficient, torch::Tensor grad_x) {
  const int64_t block = std::max<int64_t>(1, setup.sink->block_rows(setup.local));
  // A block of rows is a fraction of the slice, so proportionally more tokens per chunk keep
  // a chunk's logits at the size of the other forms' while the block's gradient is
  // accumulated (read and written whole) fewer times.
  const int64_t chunk = setup.chunk * std::max<int64_t>(1, setup.local / block);
  // The weights as the forward multiplied by them, taken before the sink steps any row.
  const torch::Tensor student_used =
                          layers::weight_in(layers::copies_of(setup.run), ws, xs.scalar_type()),
                      teacher_used =
                          layers::weight_in(layers::copies_of(setup.run), wt, xt.scalar_type());
  for (int64_t row = 0; row < setup.local; row += block) {
    const int64_t rows = std::min(block, setup.local - row);
    const int64_t real = std::clamp<int64_t>(setup.real - row, 0, rows);
    torch::Tensor grad =
        torch::zeros({rows, ws.size(1)}, ws.options().dtype(layers::accumulation_type(ws)));
    if (real > 0) {
      torch::Tensor wsb = student_used.narrow(0, row, real),
                    wtb = teacher_used.narrow(0, row, real);
      torch::Tensor grad_real = grad.narrow(0, 0, real);
      for (int64_t start = 0; start < setup.n; start += chunk) {
        const int64_t len = std::min(chunk, setup.n - start);
        torch::Tensor xs_c = xs.narrow(0, start, len);
        torch::Tensor out = gradient_buffer(len, real, xs);
        gradient_chunk(setup, stats, out, chunk_logits(xs_c, wsb),
                       chunk_logits(xt.narrow(0, start, len), wtb), kd_coefficient, ce_coefficient,
                       start, len, row);
        const torch::Tensor dz = out.to(xs.scalar_type());  // the products' type
        layers::add_transposed_product(grad_real, dz, xs_c);
        layers::add_product(grad_x.narrow(0, start, len), dz, wsb);
      }
    }
    setup.sink->take_rows(row, grad);
  }
}

// The two forms of the loss share this layout. Outputs: the weighted sums of the logit loss
// (times the T^2 scale) and, when hard targets are given, of the LM cross-entropy on the same
// student logits; computing both in one function lets the cross-entropy's softmax be formed
// again in backward instead of kept.
//
// Padding: a rank's slice may end in padded vocabulary (or be padding only). Everything is
// computed on the real columns [0, real) of the slice, so every rank takes the same path and
// the log-sum-exp correction of the dense form is added once, identically on every rank;
// padded rows of the weight get a zero gradient.
//
// Logits formed again in backward: a chunk's logits are computed from the heads' inputs in
// forward and again in backward and never kept; backward returns the gradients of the student
// head's input and weight, or streams the weight's rows to the sink. What stays from forward
// to backward is the two head inputs and per-token statistics, not [tokens, vocab] logits
// (activation checkpointing, and optimizer-in-backward, which needs the rows formed there).
struct HeadLogitDistillation : torch::autograd::Function<HeadLogitDistillation> {
  // xs [n, hs], ws [local, hs]; xt [n, ht], wt [local, ht]; w: [n]; targets: [n] or empty.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor xs, torch::Tensor ws,
                               torch::Tensor xt, torch::Tensor wt, torch::Tensor w,
                               torch::Tensor targets, LossSetup setup) {
    TokenStats stats =
        empty_stats(setup, targets, xs.options().dtype(layers::accumulation_type(xs)));
    // The heads in the inputs' types (a mixed-precision student's compute copy).
    torch::Tensor student_real_weight =
                      layers::weight_in(layers::copies_of(setup.run), ws, xs.scalar_type())
                          .narrow(0, 0, setup.real),
                  teacher_real_weight =
                      layers::weight_in(layers::copies_of(setup.run), wt, xt.scalar_type())
                          .narrow(0, 0, setup.real);
    for (int64_t start = 0; start < setup.n; start += setup.chunk) {
      const int64_t len = std::min(setup.chunk, setup.n - start);
      forward_chunk(setup, stats, chunk_logits(xs.narrow(0, start, len), student_real_weight),
                    chunk_logits(xt.narrow(0, start, len), teacher_real_weight), start, len);
    }
    torch::Tensor result = finish_forward(setup, stats, w);
    std::vector<torch::Tensor> saved = {xs, ws, xt, wt, w};
    save_stats(saved, stats);
    ctx->save_for_backward(saved);
    save_object(ctx, "setup", setup);
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const LossSetup& setup = saved_object<LossSetup>(ctx, "setup");
    torch::Tensor xs = saved[0], ws = saved[1], xt = saved[2], wt = saved[3], w = saved[4];
    const TokenStats stats = load_stats(saved, 5);
    auto [kd_coefficient, ce_coefficient] = coefficients(setup, w, grad_outputs[0]);
    variable_list result(7);
    if (setup.sink && setup.sink->streams() && ws.requires_grad()) {  // the weight's rows go there
      // Summed over blocks of the vocabulary in float32 for a 16-bit input, rounded once.
      torch::Tensor grad_x =
          torch::zeros_like(xs, xs.options().dtype(layers::accumulation_type(xs)));
      stream_student_weight_grad(setup, stats, xs, ws, xt, wt, kd_coefficient, ce_coefficient,
                                 grad_x);
      result[0] = grad_x.to(xs.scalar_type());
      return result;
    }
    // The heads in the inputs' types (a mixed-precision student's compute copy).
    torch::Tensor student_real_weight =
                      layers::weight_in(layers::copies_of(setup.run), ws, xs.scalar_type())
                          .narrow(0, 0, setup.real),
                  teacher_real_weight =
                      layers::weight_in(layers::copies_of(setup.run), wt, xt.scalar_type())
                          .narrow(0, 0, setup.real);
    torch::Tensor grad_x = torch::empty_like(xs);
    torch::Tensor grad_w = layers::zeroed_whole_gradient(
        setup.sink, ws, layers::gradients_of(setup.run));  // padded rows stay 0
    torch::Tensor grad_w_real = grad_w.narrow(0, 0, setup.real);
    for (int64_t start = 0; start < setup.n; start += setup.chunk) {
      const int64_t len = std::min(setup.chunk, setup.n - start);
      torch::Tensor xs_c = xs.narrow(0, start, len);
      torch::Tensor out = gradient_buffer(len, setup.real, xs);
      gradient_chunk(setup, stats, out, chunk_logits(xs_c, student_real_weight),
                     chunk_logits(xt.narrow(0, start, len), teacher_real_weight), kd_coefficient,
                     ce_coefficient, start, len);
      const torch::Tensor dz = out.to(xs.scalar_type());  // the products' type
      grad_x.narrow(0, start, len).copy_(layers::matmul_widening(dz, student_real_weight));
      layers::add_transposed_product(grad_w_real, dz, xs_c);
    }
    result[0] = grad_x;
    result[1] = layers::deliver_whole_gradient(setup.sink, grad_w);
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
                               torch::Tensor targets, LossSetup setup, double kd_factor,
                               double ce_factor) {
    TokenStats stats =
        empty_stats(setup, targets, xs.options().dtype(layers::accumulation_type(xs)));
    // The heads in the inputs' types (a mixed-precision student's compute copy).
    torch::Tensor student_real_weight =
                      layers::weight_in(layers::copies_of(setup.run), ws, xs.scalar_type())
                          .narrow(0, 0, setup.real),
                  teacher_real_weight =
                      layers::weight_in(layers::copies_of(setup.run), wt, xt.scalar_type())
                          .narrow(0, 0, setup.real);
    TORCH_CHECK(!setup.sink || !setup.sink->streams(),
                "the fused logit loss forms the weight's gradient in forward: no streaming sink");
    const bool want_x = xs.requires_grad(), want_w = ws.requires_grad();
    torch::Tensor grad_x = want_x ? torch::empty_like(xs) : torch::Tensor();
    torch::Tensor grad_w =
        want_w ? layers::zeroed_whole_gradient(setup.sink, ws, layers::gradients_of(setup.run))
               : torch::Tensor();
    auto [kd_coefficient, ce_coefficient] = coefficients(
        setup, w, torch::tensor({kd_factor, ce_factor}, torch::dtype(w.scalar_type())));
    for (int64_t start = 0; start < setup.n; start += setup.chunk) {
      const int64_t len = std::min(setup.chunk, setup.n - start);
      torch::Tensor xs_c = xs.narrow(0, start, len);
      // Both heads' logits and the input gradient through the engine's own products where
      // they beat the BLAS (layers/linear_products.h), as the LM-only head forms its own.
      const torch::ScalarType loss_type = layers::accumulation_type(xs);
      torch::Tensor student_rows =
          layers::product_by_transposed(xs_c, student_real_weight, setup.run).to(loss_type);
      torch::Tensor teacher_rows =
          layers::product_by_transposed(xt.narrow(0, start, len), teacher_real_weight, setup.run)
              .to(loss_type);
      torch::Tensor out;
      const bool alone = !setup.group || setup.group->size() == 1;
      if (alone && loops_apply(setup, student_rows, teacher_rows) && (want_x || want_w)) {
        // Loss and gradient in one loop, the gradient replacing the student's logits (their
        // target logits read first) and the teacher's as scratch: two chunks of [len, real].
        record_target_logits(setup, stats, student_rows, start, len);
        run_dense_loop(LoopPass::whole_and_gradient, setup, stats, student_rows, teacher_rows,
                       start, len, {}, kd_coefficient, ce_coefficient);
        out = student_rows;
        if (setup.with_ce)
          subtract_target_one_hot(out, ce_coefficient.narrow(0, start, len),
                                  stats.hit.narrow(0, start, len),
                                  stats.local_index.narrow(0, start, len));
      } else {
        forward_chunk(setup, stats, student_rows, teacher_rows, start, len);
      }
      // This chunk's per-token loss (and target logits) whole over TP now: its gradient
      // needs them.
      torch::Tensor per_token = stats.per_token.narrow(0, start, len);
      tp_reduce(per_token, setup.group, parallel::ReduceOp::Sum);
      if (setup.dense()) {
        torch::Tensor lse_s = stats.lse_s.narrow(0, start, len);
        per_token +=
            setup.kind == LogitLoss::forward_kl ? lse_s - stats.lse_t.narrow(0, start, len) : lse_s;
      }
      if (setup.with_ce) {
        torch::Tensor target_logit = stats.target_logit.narrow(0, start, len);
        tp_reduce(target_logit, setup.group, parallel::ReduceOp::Sum);
      }
      if (!want_x && !want_w) continue;
      if (!out.defined()) {
        out = gradient_buffer(len, setup.real, xs);
        gradient_chunk(setup, stats, out, student_rows, teacher_rows, kd_coefficient,
                       ce_coefficient, start, len);
      }
      out = out.to(xs.scalar_type());  // the products' type
      if (want_x) {                    // written in place: grad_x rows are contiguous
        torch::Tensor rows = grad_x.narrow(0, start, len);
        layers::product_by_out(rows, out, student_real_weight, setup.run);
      }
      if (want_w) {
        torch::Tensor grad_w_real = grad_w.narrow(0, 0, setup.real);
        layers::add_transposed_product(grad_w_real, out, xs_c);
      }
    }
    torch::Tensor kd = (stats.per_token * w).sum() * setup.scale;
    torch::Tensor ce = setup.with_ce ? ((stats.lse_1 - stats.target_logit) * w).sum()
                                     : torch::zeros({}, w.options());
    return keep_formed_gradients(ctx, grad_x, grad_w, setup.sink, kd * kd_factor + ce * ce_factor,
                                 kd, ce);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return scaled_formed_gradients(ctx, grad_outputs, 9);
  }
};

LossSetup make_setup(int64_t n, int64_t local, const torch::Tensor& targets, int64_t vocab_size,
                     const LogitLossOptions& o, const layers::TensorParallel& tp) {
  if (o.teacher_top_k > 0 && o.kind == LogitLoss::reverse_kl)
    throw UserError(
        "distill.teacher_top_k: reverse_kl is undefined where a top-k teacher has "
        "zero probability; use forward_kl or soft_ce");
  LossSetup setup;
  setup.n = n;
  setup.local = local;
  setup.vocab_start = int64_t(tp.rank()) * local;
  setup.real = std::clamp<int64_t>(vocab_size - setup.vocab_start, 0, local);
  setup.kind = o.kind;
  setup.temperature = o.temperature;
  setup.scale = o.scale_by_t2 ? o.temperature * o.temperature : 1.0;
  setup.chunk = o.chunk_tokens;
  setup.top_k = o.teacher_top_k;
  setup.with_ce = targets.defined() && targets.numel() > 0;
  setup.group = tp.group;
  return setup;
}

}  // namespace

LogitLossValue logit_distillation_from_heads(const HeadInput& student, const HeadInput& teacher,
                                             const torch::Tensor& weight,
                                             const torch::Tensor& targets, int64_t vocab_size,
                                             const LogitLossOptions& options,
                                             const layers::TensorParallel& tp,
                                             const LossFactors& factors, HeadLogits head_logits,
                                             layers::RunContext* run) {
  const int64_t local = student.weight.size(0);
  TORCH_CHECK(teacher.weight.size(0) == local, "student and teacher vocabulary slices differ");
  torch::Tensor xs = student.input.reshape({-1, student.input.size(-1)});
  torch::Tensor flat_targets =
      targets.defined() ? targets.reshape({-1}) : torch::zeros({0}, torch::kLong);
  LossSetup setup = make_setup(xs.size(0), local, flat_targets, vocab_size, options, tp);
  setup.sink = student.weight_grad_sink;
  setup.run = run;
  torch::Tensor xt = teacher.input.detach().reshape({-1, teacher.input.size(-1)});
  torch::Tensor wt = teacher.weight.detach();
  torch::Tensor w = weight.reshape({-1}).to(layers::accumulation_type(xs));
  // A sink that steps rows as they come needs them formed in backward.
  const bool streaming = setup.sink && setup.sink->streams() && student.weight.requires_grad();
  if (head_logits == HeadLogits::formed_again_in_backward || streaming) {
    torch::Tensor both =
        HeadLogitDistillation::apply(xs, student.weight, xt, wt, w, flat_targets, setup);
    torch::Tensor kd = both[0], ce = both[1];
    return {kd * factors.kd + ce * factors.ce, kd.detach(), ce.detach()};
  }
  variable_list out;
  if (torch::GradMode::is_enabled()) {
    out = FusedHeadLogitDistillation::apply(xs, student.weight, xt, wt, w, flat_targets, setup,
                                            factors.kd, factors.ce);
  } else {  // nothing to differentiate: the same forward, no gradients formed
    AutogradContext unused;
    out = FusedHeadLogitDistillation::forward(&unused, xs.detach(), student.weight.detach(), xt, wt,
                                              w, flat_targets, setup, factors.kd, factors.ce);
  }
  return {out[0], out[1], out[2]};
}

}  // namespace retort::distill
