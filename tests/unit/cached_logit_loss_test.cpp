// tests/unit/cached_logit_loss_test.cpp: the logit loss against a cached top-k teacher
// (distill/cached_logit_loss.h) against a float64 reference formed densely by torch's autograd
// from its definition: renormalised top k and ghost tail, forward_kl and soft_ce, temperature and
// T^2 scaling, masked tokens, the LM cross-entropy alongside, a padded vocabulary. And float16
// cached values against the exact ones, within a bound derived from float16's rounding.
#include "distill/cached_logit_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

using namespace retort;
using namespace retort::distill;

namespace {

constexpr int64_t kTokens = 24, kHidden = 16, kVocab = 50, kPadded = 64;

struct Problem {
  torch::Tensor x, w, teacher_logits, weight, targets;
};

Problem make_problem(uint64_t seed) {
  torch::manual_seed(seed);
  Problem p;
  auto f64 = torch::kDouble;
  p.x = torch::randn({kTokens, kHidden}, f64);
  p.w = torch::randn({kPadded, kHidden}, f64) * 0.5;
  p.teacher_logits = torch::randn({kTokens, kVocab}, f64) * 2.5;
  p.weight = (torch::rand({kTokens}, f64) > 0.2).to(f64);  // some tokens masked
  p.targets = torch::randint(0, kVocab, {kTokens}, torch::kLong);
  return p;
}

// The teacher's top k at temperature T, as a cache stores it.
SparseTeacher top_k_of(const torch::Tensor& teacher_logits, int64_t k, double temperature) {
  const torch::Tensor log_p = torch::log_softmax(teacher_logits / temperature, -1);
  auto [values, ids] = log_p.topk(k, -1);
  const torch::Tensor rest = log_p.scatter(1, ids, -INFINITY);
  return {values, ids, torch::logsumexp(rest, -1)};
}

// The definition, densely, by autograd: per-token losses over the real vocabulary.
torch::Tensor reference_per_token(const torch::Tensor& z, const SparseTeacher& t, LogitLoss kind,
                                  TopKTail tail, double temperature) {
  const torch::Tensor log_q = torch::log_softmax(z.narrow(1, 0, kVocab) / temperature, -1);
  const torch::Tensor log_q_k = log_q.gather(1, t.ids);
  torch::Tensor log_p = t.log_probs;
  if (tail == TopKTail::renormalise) log_p = log_p - torch::logsumexp(log_p, -1, true);
  const torch::Tensor p = log_p.exp();
  torch::Tensor loss = -(p * log_q_k).sum(-1);
  if (kind == LogitLoss::forward_kl) loss = loss + (p * log_p).sum(-1);
  if (tail == TopKTail::ghost) {
    const torch::Tensor log_q_tail = torch::logsumexp(log_q.scatter(1, t.ids, -INFINITY), -1);
    const torch::Tensor m = t.tail_log_mass.exp();
    const torch::Tensor zero = torch::zeros({}, m.options());  // 0 log 0 = 0: no tail
    loss = loss - torch::where(m > 0, m * log_q_tail, zero);
    if (kind == LogitLoss::forward_kl) loss = loss + torch::where(m > 0, m * t.tail_log_mass, zero);
  }
  return loss;
}

struct Outcome {
  torch::Tensor loss, grad_x, grad_w;
};

constexpr double kKd = 0.7, kCe = 0.3;

Outcome ours(const Problem& p, const SparseTeacher& t, const LogitLossOptions& o, bool with_ce) {
  torch::Tensor x = p.x.clone().requires_grad_(true), w = p.w.clone().requires_grad_(true);
  const LogitLossValue value = logit_distillation_from_cache(
      {x, w}, t, p.weight, with_ce ? p.targets : torch::Tensor(), kVocab, o,
      layers::TensorParallel{}, {kKd, with_ce ? kCe : 0.0});
  value.total.backward();
  return {value.total.detach(), x.grad(), w.grad()};
}

Outcome reference(const Problem& p, const SparseTeacher& t, const LogitLossOptions& o,
                  bool with_ce) {
  torch::Tensor x = p.x.clone().requires_grad_(true), w = p.w.clone().requires_grad_(true);
  const torch::Tensor z = x.matmul(w.t());
  const double scale = o.scale_by_t2 ? o.temperature * o.temperature : 1.0;
  torch::Tensor total =
      kKd * scale *
      (reference_per_token(z, t, o.kind, o.top_k_tail, o.temperature) * p.weight).sum();
  if (with_ce)
    total = total +
            kCe * (torch::nn::functional::cross_entropy(
                       z.narrow(1, 0, kVocab), p.targets,
                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone)) *
                   p.weight)
                      .sum();
  total.backward();
  return {total.detach(), x.grad(), w.grad()};
}

double relative(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).norm().item<double>() / want.norm().item<double>();
}

}  // namespace

TEST(CachedLogitLoss, MatchesTheDenseDefinitionInFloat64) {
  const Problem p = make_problem(3);
  int cases = 0;
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::soft_ce})
    for (TopKTail tail : {TopKTail::renormalise, TopKTail::ghost})
      for (double temperature : {1.0, 2.0})
        for (bool with_ce : {false, true})
          for (int64_t k : {int64_t(1), int64_t(7), kVocab}) {
            LogitLossOptions o;
            o.kind = kind;
            o.top_k_tail = tail;
            o.temperature = temperature;
            o.chunk_tokens = 5;  // several chunks, the last one short
            const SparseTeacher t = top_k_of(p.teacher_logits, k, temperature);
            const Outcome got = ours(p, t, o, with_ce), want = reference(p, t, o, with_ce);
            const std::string label = enum_name(kind) + " " + enum_name(tail) +
                                      " T=" + std::to_string(temperature) +
                                      " ce=" + std::to_string(with_ce) + " k=" + std::to_string(k);
            EXPECT_LT(relative(got.loss, want.loss), 1e-12) << label;
            EXPECT_LT(relative(got.grad_x, want.grad_x), 1e-12) << label;
            EXPECT_LT(relative(got.grad_w, want.grad_w), 1e-12) << label;
            // Padded rows of the head get no gradient.
            EXPECT_EQ(got.grad_w.narrow(0, kVocab, kPadded - kVocab).abs().max().item<double>(), 0)
                << label;
            ++cases;
          }
  EXPECT_EQ(cases, 48);
}

// float16 log-probabilities (the default cache) against the exact ones. Each cached lp_j is
// rounded to the nearest float16: delta_j = lp16_j - lp_j, |delta_j| <= u |lp_j| with u = 2^-11
// (every |lp| here lies in float16's normal range). Renormalised, lp_r_j moves by at most 2D
// (D = max_j |delta_j| of the token), so each p_j by a factor within [e^-2D, e^2D].
// Worst case: per token the forward KL sum_j p_j (lp_r_j - log q_j) moves by at most
// (e^2D - 1) sum_j p_j |lp_r_j - log q_j| + 2D (e^2D - 1), and the gradient with respect to
// logit j by the coefficient times p_j (e^2D - 1); the input's and head's gradients by at most
// that matrix's Frobenius norm times the other factor's.
// Expected size: to first order the token's loss moves by sum_j delta_j p_j (a_j - a_bar), with
// a_j = lp_r_j - log q_j and a_bar = sum_j p_j a_j. Modelling each rounding error as independent
// and uniform in [-u |lp_j|, u |lp_j|] (variance u^2 lp_j^2 / 3, at least the true one: a
// float16's half-ulp is at most u |lp|), token i's change has standard deviation
// sigma_i = kd T^2 sqrt(sum_j p_j^2 (a_j - a_bar)^2 u^2 lp_j^2 / 3). The root mean square of
// change_i / sigma_i over the tokens is then at most about 1; it is held to 2 (for 20 tokens a
// chi-square beyond 4 times its mean has probability below 1e-9). Values rounded to bfloat16
// (u = 2^-8, eight times coarser) give about 5 and fail.
TEST(CachedLogitLoss, Float16ValuesStayWithinTheirRoundingBound) {
  const Problem p = make_problem(5);
  LogitLossOptions o;
  o.kind = LogitLoss::forward_kl;
  o.temperature = 2.0;
  o.chunk_tokens = 7;
  const double scale = o.temperature * o.temperature;
  const SparseTeacher exact = top_k_of(p.teacher_logits, 9, o.temperature);
  const SparseTeacher rounded{exact.log_probs.to(torch::kHalf).to(torch::kDouble), exact.ids,
                              exact.tail_log_mass.to(torch::kHalf).to(torch::kDouble)};
  ASSERT_GT((rounded.log_probs - exact.log_probs).abs().max().item<double>(), 0);
  const Outcome a = ours(p, exact, o, false), b = ours(p, rounded, o, false);

  const torch::Tensor d = exact.log_probs.abs().amax(-1) * std::ldexp(1.0, -11);  // D per token
  const torch::Tensor grow = (2 * d).exp() - 1;
  const torch::Tensor log_p = exact.log_probs - torch::logsumexp(exact.log_probs, -1, true);
  const torch::Tensor log_q =
      torch::log_softmax(p.x.matmul(p.w.t()).narrow(1, 0, kVocab) / o.temperature, -1);
  const torch::Tensor spread = (log_p.exp() * (log_p - log_q.gather(1, exact.ids)).abs()).sum(-1);
  const double loss_bound =
      kKd * scale * (p.weight * (grow * spread + 2 * d * grow)).sum().item<double>();
  const double loss_moved = (a.loss - b.loss).abs().item<double>();
  EXPECT_GT(loss_moved, 0);
  EXPECT_LE(loss_moved, loss_bound);
  const torch::Tensor a_j = log_p - log_q.gather(1, exact.ids);
  const torch::Tensor a_bar = (log_p.exp() * a_j).sum(-1, true);
  const double u = std::ldexp(1.0, -11);
  const torch::Tensor sigma =
      kKd * scale *
      ((log_p.exp().pow(2) * (a_j - a_bar).pow(2) * exact.log_probs.pow(2)).sum(-1) * (u * u / 3))
          .sqrt();
  double squares = 0;
  int tokens = 0;
  for (int64_t i = 0; i < kTokens; ++i) {
    if (p.weight[i].item<double>() == 0) continue;
    Problem one = p;
    one.weight = torch::zeros_like(p.weight);
    one.weight[i] = 1;
    const double change =
        (ours(one, rounded, o, false).loss - ours(one, exact, o, false).loss).item<double>();
    squares += std::pow(change / sigma[i].item<double>(), 2);
    ++tokens;
  }
  EXPECT_LE(std::sqrt(squares / tokens), 2.0) << "over " << tokens << " tokens";
  const torch::Tensor coefficient = p.weight * (kKd * scale / o.temperature);
  const double logit_grad_bound =
      ((coefficient * grow).unsqueeze(1) * log_p.exp()).norm().item<double>();
  EXPECT_LE((a.grad_x - b.grad_x).norm().item<double>(),
            logit_grad_bound * p.w.narrow(0, 0, kVocab).norm().item<double>());
  EXPECT_LE((a.grad_w - b.grad_w).norm().item<double>(),
            logit_grad_bound * p.x.norm().item<double>());
}
