// distill/cached_logit_loss.cpp: see cached_logit_loss.h.
#include "distill/cached_logit_loss.h"

#include <algorithm>
#include <limits>

#include "common/saved_object.h"
#include "distill/formed_gradients.h"
#include "distill/split_vocabulary.h"
#include "layers/accumulation_type.h"
#include "layers/compute_copy.h"
#include "layers/linear_products.h"

namespace retort::distill {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

struct CacheLossSetup {
  int64_t n = 0, local = 0, real = 0, vocab_start = 0, chunk = 1;
  LogitLoss kind = LogitLoss::forward_kl;
  TopKTail tail = TopKTail::renormalise;
  double temperature = 1, scale = 1;
  bool with_ce = false;
  parallel::Communicator* group = &parallel::Communicator::one_process();
  layers::HeadGradSink* sink = nullptr;
  layers::RunContext* run = nullptr;
};

// A chunk's cached teacher where the loss needs it: p (renormalised or as cached), p log p
// summed, the tail mass m (0 when renormalised), and which cached ids fall in this rank's slice.
struct ChunkTeacher {
  torch::Tensor p, p_log_p, m, tail, hit, hit_mask, local_index;
};

ChunkTeacher chunk_teacher(const CacheLossSetup& setup, const SparseTeacher& teacher, int64_t start,
                           int64_t len, torch::ScalarType type) {
  ChunkTeacher c;
  torch::Tensor log_p = teacher.log_probs.narrow(0, start, len).to(type);
  const torch::Tensor ids = teacher.ids.narrow(0, start, len);
  c.tail = teacher.tail_log_mass.narrow(0, start, len).to(type);
  if (setup.tail == TopKTail::renormalise) {
    log_p = log_p - torch::logsumexp(log_p, 1, true);
    c.m = torch::zeros({len}, log_p.options());
  } else {
    c.m = c.tail.exp();
  }
  c.p = log_p.exp();
  // 0 log 0 = 0: a cached entry of zero probability adds nothing.
  c.p_log_p = torch::where(c.p > 0, c.p * log_p, torch::zeros({}, c.p.options())).sum(1);
  c.hit_mask = (ids >= setup.vocab_start) & (ids < setup.vocab_start + setup.real);
  c.hit = c.hit_mask.to(type);
  c.local_index = torch::where(c.hit_mask, ids - setup.vocab_start, torch::zeros_like(ids));
  return c;
}

// The per-token logit loss of a chunk (whole over TP) and, when wanted, its gradient with
// respect to the real student logits z [len, real], given the per-token coefficients kd_c (of
// the logit loss, already / T) and ce_c (of the cross-entropy).
struct ChunkResult {
  torch::Tensor per_token, lse_1, target_logit, grad;
  torch::Tensor hit, index;  // the targets in this rank's slice, and their local columns
};

// z is the chunk's own: the gradient is formed in its memory (one [len, real] buffer at T = 1;
// a second at T != 1 with the cross-entropy, whose softmax is at T = 1).
ChunkResult chunk_loss(const CacheLossSetup& setup, torch::Tensor z, const ChunkTeacher& t,
                       const torch::Tensor& targets, const torch::Tensor& kd_c,
                       const torch::Tensor& ce_c, bool want_grad) {
  const bool has_columns = z.size(1) > 0;
  torch::Tensor ss = setup.temperature == 1.0 ? z : z / setup.temperature;
  const torch::Tensor lse_s = split_logsumexp(ss, setup.group);
  ChunkResult r;
  r.lse_1 = setup.with_ce && setup.temperature != 1.0 ? split_logsumexp(z, setup.group) : lse_s;
  // sum_K p s over the cached ids this rank holds, summed over TP.
  torch::Tensor s_at = has_columns ? ss.gather(1, t.local_index) * t.hit : torch::zeros_like(t.p);
  torch::Tensor p_s = (t.p * s_at).sum(1);
  tp_reduce(p_s, setup.group, parallel::ReduceOp::Sum);
  // -sum_K p log q = sum_K p lse_s - sum_K p s.
  const torch::Tensor p_sum = t.p.sum(1);
  r.per_token = p_sum * lse_s - p_s;
  if (setup.kind == LogitLoss::forward_kl) r.per_token += t.p_log_p;
  torch::Tensor log_q_tail;  // the student's log mass outside K (ghost)
  if (setup.tail == TopKTail::ghost) {
    torch::Tensor rest = ss.clone();
    if (has_columns) {
      const torch::Tensor rows =
          torch::arange(ss.size(0), t.local_index.options()).unsqueeze(1).expand_as(t.local_index);
      rest.index_put_({rows.masked_select(t.hit_mask), t.local_index.masked_select(t.hit_mask)},
                      torch::full({}, -kInfinity, rest.options()));
    }
    log_q_tail = split_logsumexp(rest, setup.group) - lse_s;
    const torch::Tensor has_tail = t.m > 0;
    const torch::Tensor zero = torch::zeros({}, t.m.options());
    r.per_token -= torch::where(has_tail, t.m * log_q_tail, zero);
    if (setup.kind == LogitLoss::forward_kl)
      r.per_token += torch::where(has_tail, t.m * t.tail, zero);
  }
  if (setup.with_ce) {
    const torch::Tensor hit =
        (targets >= setup.vocab_start) & (targets < setup.vocab_start + setup.real);
    const torch::Tensor index =
        torch::where(hit, targets - setup.vocab_start, torch::zeros_like(targets));
    r.target_logit = has_columns ? torch::where(hit, z.gather(1, index.unsqueeze(1)).squeeze(1),
                                                torch::zeros({}, z.options()))
                                 : torch::zeros({z.size(0)}, z.options());
    tp_reduce(r.target_logit, setup.group, parallel::ReduceOp::Sum);
    if (want_grad && has_columns) r.hit = hit, r.index = index;
  }
  if (!want_grad || !has_columns) return r;
  const bool ce_at_one = setup.with_ce && setup.temperature == 1.0;
  // The T = 1 softmax of the cross-entropy, in z's memory (ss is apart from it here).
  torch::Tensor softmax;
  if (setup.with_ce && !ce_at_one) softmax = z.sub_(r.lse_1.unsqueeze(1)).exp_();
  const torch::Tensor q = ss.sub_(lse_s.unsqueeze(1)).exp_();  // in place: z itself at T = 1
  const torch::Tensor kd_c_col = kd_c.unsqueeze(1);
  // Per token: c q_v everywhere (with the cross-entropy's q_v at T = 1), less m q_v / q_tail
  // (ghost) everywhere, given back on K below.
  torch::Tensor coefficient = kd_c * (p_sum + t.m);
  torch::Tensor at_k = -t.p * kd_c_col;
  if (setup.tail == TopKTail::ghost) {
    const torch::Tensor g =
        torch::where(t.m > 0, (t.tail - log_q_tail).exp(), torch::zeros({}, t.m.options())) * kd_c;
    coefficient = coefficient - g;
    at_k += q.gather(1, t.local_index) * g.unsqueeze(1);  // before q is scaled
  }
  if (ce_at_one) coefficient = coefficient + ce_c;
  r.grad = q.mul_(coefficient.unsqueeze(1));
  r.grad.scatter_add_(1, t.local_index, at_k * t.hit);
  if (setup.with_ce) {
    if (!ce_at_one) r.grad.addcmul_(softmax, ce_c.unsqueeze(1));
    r.grad.scatter_add_(1, r.index.unsqueeze(1), (-ce_c * r.hit.to(ce_c.dtype())).unsqueeze(1));
  }
  return r;
}

// The loss with the head fused in and its gradient formed in forward; backward scales it.
struct CachedLogitDistillation : torch::autograd::Function<CachedLogitDistillation> {
  static variable_list forward(AutogradContext* ctx, torch::Tensor xs, torch::Tensor ws,
                               torch::Tensor w, torch::Tensor targets, SparseTeacher teacher,
                               CacheLossSetup setup, double kd_factor, double ce_factor) {
    const torch::ScalarType loss_type = layers::accumulation_type(xs);
    const torch::Tensor real_weight =
        layers::weight_in(layers::copies_of(setup.run), ws, xs.scalar_type())
            .narrow(0, 0, setup.real);
    const bool want_x = xs.requires_grad(), want_w = ws.requires_grad();
    torch::Tensor grad_x = want_x ? torch::zeros_like(xs) : torch::Tensor();
    torch::Tensor grad_w =
        want_w ? layers::zeroed_whole_gradient(setup.sink, ws, layers::gradients_of(setup.run))
               : torch::Tensor();
    const torch::Tensor kd_c = w * (kd_factor * setup.scale / setup.temperature);
    const torch::Tensor ce_c = w * ce_factor;
    torch::Tensor per_token = torch::empty({setup.n}, w.options());
    torch::Tensor ce_token = torch::zeros({setup.with_ce ? setup.n : 0}, w.options());
    for (int64_t start = 0; start < setup.n; start += setup.chunk) {
      const int64_t len = std::min(setup.chunk, setup.n - start);
      const torch::Tensor xs_c = xs.narrow(0, start, len);
      const torch::Tensor z =
          layers::product_by_transposed(xs_c, real_weight, setup.run).to(loss_type);
      const ChunkResult r =
          chunk_loss(setup, z, chunk_teacher(setup, teacher, start, len, loss_type),
                     setup.with_ce ? targets.narrow(0, start, len) : torch::Tensor(),
                     kd_c.narrow(0, start, len), ce_c.narrow(0, start, len), want_x || want_w);
      per_token.narrow(0, start, len).copy_(r.per_token);
      if (setup.with_ce) ce_token.narrow(0, start, len).copy_(r.lse_1 - r.target_logit);
      if (!r.grad.defined()) continue;
      const torch::Tensor dz = r.grad.to(xs.scalar_type());  // the products' type
      if (want_x) {
        torch::Tensor rows = grad_x.narrow(0, start, len);
        layers::product_by_out(rows, dz, real_weight, setup.run);
      }
      if (want_w) {
        torch::Tensor grad_w_real = grad_w.narrow(0, 0, setup.real);
        layers::add_transposed_product(grad_w_real, dz, xs_c);
      }
    }
    torch::Tensor kd = (per_token * w).sum() * setup.scale;
    torch::Tensor ce = setup.with_ce ? (ce_token * w).sum() : torch::zeros({}, w.options());
    return keep_formed_gradients(ctx, grad_x, grad_w, setup.sink, kd * kd_factor + ce * ce_factor,
                                 kd, ce);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return scaled_formed_gradients(ctx, grad_outputs, 8);
  }
};

}  // namespace

LogitLossValue logit_distillation_from_cache(const HeadInput& student, const SparseTeacher& teacher,
                                             const torch::Tensor& weight,
                                             const torch::Tensor& targets, int64_t vocab_size,
                                             const LogitLossOptions& options,
                                             const layers::TensorParallel& tp,
                                             const LossFactors& factors, layers::RunContext* run) {
  TORCH_CHECK(options.kind != LogitLoss::reverse_kl,
              "a cached top-k teacher has no reverse_kl (checked when the run is built)");
  TORCH_CHECK(!student.weight_grad_sink || !student.weight_grad_sink->streams(),
              "the cached logit loss forms the weight's gradient in forward: no streaming sink");
  const torch::Tensor xs = student.input.reshape({-1, student.input.size(-1)});
  CacheLossSetup setup;
  setup.n = xs.size(0);
  setup.local = student.weight.size(0);
  setup.vocab_start = int64_t(tp.rank()) * setup.local;
  setup.real = std::clamp<int64_t>(vocab_size - setup.vocab_start, 0, setup.local);
  setup.kind = options.kind;
  setup.tail = options.top_k_tail;
  setup.temperature = options.temperature;
  setup.scale = options.scale_by_t2 ? options.temperature * options.temperature : 1.0;
  setup.chunk = options.chunk_tokens;
  setup.with_ce = targets.defined() && targets.numel() > 0;
  setup.group = tp.group;
  setup.sink = student.weight_grad_sink;
  setup.run = run;
  const int64_t k = teacher.ids.size(-1);
  SparseTeacher flat{teacher.log_probs.reshape({-1, k}), teacher.ids.reshape({-1, k}),
                     teacher.tail_log_mass.reshape({-1})};
  TORCH_CHECK(flat.ids.size(0) == setup.n, "the cached teacher covers ", flat.ids.size(0),
              " tokens, the student ", setup.n);
  const torch::Tensor w = weight.reshape({-1}).to(layers::accumulation_type(xs));
  const torch::Tensor flat_targets =
      setup.with_ce ? targets.reshape({-1}) : torch::zeros({0}, torch::kLong);
  variable_list out;
  if (torch::GradMode::is_enabled()) {
    out = CachedLogitDistillation::apply(xs, student.weight, w, flat_targets, flat, setup,
                                         factors.kd, factors.ce);
  } else {
    AutogradContext unused;
    out = CachedLogitDistillation::forward(&unused, xs.detach(), student.weight.detach(), w,
                                           flat_targets, flat, setup, factors.kd, factors.ce);
  }
  return {out[0], out[1], out[2]};
}

}  // namespace retort::distill
