// tests/unit/distill_losses_test.cpp: each distillation loss against an independent
// double-precision reference built from torch's own functions (log_softmax, kl_div,
// cosine_similarity, norms), values and gradients, with temperature, T^2 scaling, masked
// tokens and a padded vocabulary.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "distill/activation_losses.h"
#include "distill/distillation.h"
#include "distill/logit_losses.h"
#include "distill/teacher.h"
#include "layers/model.h"
#include "tests/support/logit_loss_on_logits.h"

using namespace retort;
using namespace retort::distill;
using retort::testing::logit_loss_on_logits;
namespace F = torch::nn::functional;

namespace {

constexpr int64_t kVocab = 50, kPadded = 64;
constexpr HeadLogits kBothForms[] = {HeadLogits::gradient_in_forward,
                                     HeadLogits::formed_again_in_backward};

// Reference per-token losses over the real vocabulary.
torch::Tensor reference_logit_loss(const torch::Tensor& s, const torch::Tensor& t, LogitLoss kind,
                                   double temperature) {
  torch::Tensor log_q = torch::log_softmax(s.narrow(-1, 0, kVocab) / temperature, -1);
  torch::Tensor log_p = torch::log_softmax(t.narrow(-1, 0, kVocab) / temperature, -1);
  switch (kind) {
    case LogitLoss::forward_kl:  // kl_div(input=log q, target=p) = sum p (log p - log q)
      return F::kl_div(log_q, log_p, F::KLDivFuncOptions().reduction(torch::kNone).log_target(true))
          .sum(-1);
    case LogitLoss::reverse_kl:
      return F::kl_div(log_p, log_q, F::KLDivFuncOptions().reduction(torch::kNone).log_target(true))
          .sum(-1);
    case LogitLoss::soft_ce:
      return -(log_p.exp() * log_q).sum(-1);
  }
  return {};
}

}  // namespace

TEST(LogitLosses, MatchReferenceValuesAndGradients) {
  torch::manual_seed(3);
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::reverse_kl, LogitLoss::soft_ce}) {
    for (double temperature : {1.0, 2.5}) {
      for (HeadLogits form : kBothForms) {
        torch::Tensor s = (torch::randn({3, 7, kPadded}, torch::kDouble) * 2).requires_grad_(true);
        torch::Tensor t = torch::randn({3, 7, kPadded}, torch::kDouble) * 2;
        torch::Tensor weight = torch::ones({3, 7}, torch::kDouble);
        weight[0][3] = 0;
        weight[2][6] = 0;
        LogitLossOptions o;
        o.kind = kind;
        o.temperature = temperature;
        o.chunk_tokens = 4;  // several chunks, one partial
        torch::Tensor loss =
            logit_loss_on_logits(s, t, weight, {}, kVocab, o, {}, {1, 0}, form).total;
        loss.backward();
        torch::Tensor s_ref = s.detach().clone().requires_grad_(true);
        torch::Tensor ref = (reference_logit_loss(s_ref, t, kind, temperature) * weight).sum() *
                            temperature * temperature;
        ref.backward();
        EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-10)
            << int(kind) << " T" << temperature;
        EXPECT_TRUE(torch::allclose(s.grad(), s_ref.grad(), 1e-9, 1e-12)) << int(kind);
        // Padded vocabulary and masked tokens get no gradient.
        EXPECT_EQ(s.grad().narrow(-1, kVocab, kPadded - kVocab).abs().max().item<double>(), 0.0);
        EXPECT_EQ(s.grad()[0][3].abs().max().item<double>(), 0.0);
      }
    }
  }
}

TEST(LogitLosses, FusedCrossEntropyMatchesTorch) {
  torch::manual_seed(8);
  for (double temperature : {1.0, 3.0})
    for (HeadLogits form : kBothForms) {
      torch::Tensor s = (torch::randn({2, 9, kPadded}, torch::kDouble) * 2).requires_grad_(true);
      torch::Tensor t = torch::randn({2, 9, kPadded}, torch::kDouble);
      torch::Tensor targets = torch::randint(kVocab, {2, 9}, torch::kLong);
      targets[1][4] = -100;
      torch::Tensor weight = targets.ne(-100).to(torch::kDouble);
      LogitLossOptions o;
      o.temperature = temperature;
      o.chunk_tokens = 5;
      LogitLossValue value =
          logit_loss_on_logits(s, t, weight, targets, kVocab, o, {}, {0.7, 0.3}, form);
      value.total.backward();
      torch::Tensor x = s.detach().clone().requires_grad_(true);
      torch::Tensor ref_kd =
          (reference_logit_loss(x, t, LogitLoss::forward_kl, temperature) * weight).sum() *
          temperature * temperature;
      torch::Tensor ref_ce =
          F::cross_entropy(x.narrow(-1, 0, kVocab).reshape({-1, kVocab}), targets.reshape({-1}),
                           F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100));
      (0.7 * ref_kd + 0.3 * ref_ce).backward();
      EXPECT_NEAR(value.kd_sum.item<double>(), ref_kd.item<double>(), 1e-10);
      EXPECT_NEAR(value.ce_sum.item<double>(), ref_ce.item<double>(), 1e-10);
      EXPECT_NEAR(value.total.item<double>(), (0.7 * ref_kd + 0.3 * ref_ce).item<double>(), 1e-10);
      EXPECT_TRUE(torch::allclose(s.grad(), x.grad(), 1e-9, 1e-12)) << "T " << temperature;
    }
}

TEST(LogitLosses, TopKTeacherMatchesReference) {
  torch::manual_seed(9);
  const int64_t k = 7;
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::soft_ce})
    for (HeadLogits form : kBothForms) {
      torch::Tensor s = torch::randn({6, kPadded}, torch::kDouble).requires_grad_(true);
      torch::Tensor t = torch::randn({6, kPadded}, torch::kDouble) * 3;
      torch::Tensor w = torch::ones({6}, torch::kDouble);
      LogitLossOptions o;
      o.kind = kind;
      o.temperature = 1.5;
      o.teacher_top_k = k;
      o.chunk_tokens = 4;
      torch::Tensor loss = logit_loss_on_logits(s, t, w, {}, kVocab, o, {}, {1, 0}, form).total;
      loss.backward();
      // Reference: the teacher's k largest real-vocabulary logits, renormalised.
      torch::Tensor x = s.detach().clone().requires_grad_(true);
      torch::Tensor tv = t.narrow(-1, 0, kVocab) / 1.5;
      auto [values, indices] = tv.topk(k, -1);
      torch::Tensor log_p_k = torch::log_softmax(values, -1);
      torch::Tensor log_q =
          torch::log_softmax(x.narrow(-1, 0, kVocab) / 1.5, -1).gather(-1, indices);
      torch::Tensor per_token = kind == LogitLoss::forward_kl
                                    ? (log_p_k.exp() * (log_p_k - log_q)).sum(-1)
                                    : -(log_p_k.exp() * log_q).sum(-1);
      torch::Tensor ref = per_token.sum() * 1.5 * 1.5;
      ref.backward();
      EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-10) << int(kind);
      EXPECT_TRUE(torch::allclose(s.grad(), x.grad(), 1e-9, 1e-12)) << int(kind);
    }
}

TEST(LogitLosses, UnpaddedVocabularyMatchesReference) {
  // No padding: the dense code path (log-sum-exps added after the sums, q and p in place).
  torch::manual_seed(10);
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::soft_ce}) {
    for (double temperature : {1.0, 2.0}) {
      for (bool with_ce : {false, true}) {
        for (HeadLogits form : kBothForms) {
          torch::Tensor s = (torch::randn({5, kPadded}, torch::kDouble) * 2).requires_grad_(true);
          torch::Tensor t = torch::randn({5, kPadded}, torch::kDouble) * 2;
          torch::Tensor targets = torch::randint(kPadded, {5}, torch::kLong);
          targets[2] = -100;
          torch::Tensor w = targets.ne(-100).to(torch::kDouble);
          LogitLossOptions o;
          o.kind = kind;
          o.temperature = temperature;
          o.chunk_tokens = 2;
          LogitLossValue value = logit_loss_on_logits(s, t, w, with_ce ? targets : torch::Tensor(),
                                                      kPadded, o, {}, {1, 0.5}, form);
          value.total.backward();
          torch::Tensor x = s.detach().clone().requires_grad_(true);
          torch::Tensor log_q = torch::log_softmax(x / temperature, -1);
          torch::Tensor log_p = torch::log_softmax(t / temperature, -1);
          torch::Tensor per_token = kind == LogitLoss::forward_kl
                                        ? (log_p.exp() * (log_p - log_q)).sum(-1)
                                        : -(log_p.exp() * log_q).sum(-1);
          torch::Tensor ref = (per_token * w).sum() * temperature * temperature;
          if (with_ce)
            ref = ref +
                  0.5 * F::cross_entropy(
                            x, targets,
                            F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100));
          ref.backward();
          EXPECT_NEAR(value.total.item<double>(), ref.item<double>(), 1e-10);
          EXPECT_TRUE(torch::allclose(s.grad(), x.grad(), 1e-9, 1e-12))
              << int(kind) << " T" << temperature << " ce " << with_ce;
        }
      }
    }
  }
}

TEST(LogitLosses, ZeroWhenStudentEqualsTeacher) {
  torch::Tensor s = torch::randn({4, kPadded}, torch::kDouble).requires_grad_(true);
  torch::Tensor w = torch::ones({4}, torch::kDouble);
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::reverse_kl}) {
    LogitLossOptions o;
    o.kind = kind;
    torch::Tensor loss = logit_loss_on_logits(s, s.detach(), w, {}, kVocab, o, {}, {1, 0}).total;
    EXPECT_NEAR(loss.item<double>(), 0.0, 1e-12);
  }
}

TEST(ActivationLosses, MatchReference) {
  torch::manual_seed(4);
  torch::Tensor s = torch::randn({2, 5, 8}, torch::kDouble).requires_grad_(true);
  torch::Tensor t = torch::randn({2, 5, 8}, torch::kDouble);
  torch::Tensor w = torch::ones({2, 5}, torch::kDouble);
  w[1][0] = 0;
  struct Case {
    ActivationLoss kind;
    std::function<torch::Tensor(const torch::Tensor&)> reference;  // per token
  };
  std::vector<Case> cases = {
      {ActivationLoss::mse,
       [&](const torch::Tensor& x) {
         return F::mse_loss(x, t, F::MSELossFuncOptions().reduction(torch::kNone)).mean(-1);
       }},
      {ActivationLoss::cosine,
       [&](const torch::Tensor& x) {
         return 1 - F::cosine_similarity(x, t, F::CosineSimilarityFuncOptions().dim(-1));
       }},
      {ActivationLoss::l2, [&](const torch::Tensor& x) { return torch::norm(x - t, 2, {-1}); }},
  };
  for (const Case& c : cases) {
    if (s.grad().defined()) s.mutable_grad().zero_();
    torch::Tensor loss = activation_distillation_sum(s, t, w, c.kind, {});
    loss.backward();
    torch::Tensor x = s.detach().clone().requires_grad_(true);
    torch::Tensor ref = (c.reference(x) * w).sum();
    ref.backward();
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-10) << int(c.kind);
    EXPECT_TRUE(torch::allclose(s.grad(), x.grad(), 1e-8, 1e-12)) << int(c.kind);
  }
}

// Both heads fused into the logit loss (chunk by chunk; the gradient formed in forward, or the
// logits formed again in backward) against plain torch on materialised logits: the weighted
// total and the gradients of the student head's input and weight, every loss kind, padded
// vocabulary rows, masked tokens and ignored targets.
TEST(LogitLosses, FusedHeadsMatchReferenceOnLogits) {
  torch::manual_seed(5);
  const int64_t n = 21, hs = 12, ht = 16;
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::reverse_kl, LogitLoss::soft_ce})
    for (double temperature : {1.0, 2.5})
      for (bool recompute : {false, true}) {
        torch::Tensor xs = torch::randn({n, hs}, torch::kDouble).requires_grad_(true);
        torch::Tensor ws = torch::randn({kPadded, hs}, torch::kDouble).requires_grad_(true);
        torch::Tensor xt = torch::randn({n, ht}, torch::kDouble);
        torch::Tensor wt = torch::randn({kPadded, ht}, torch::kDouble);
        torch::Tensor targets = torch::randint(kVocab, {n}, torch::kLong);
        targets[4] = -100;
        torch::Tensor weight = targets.ne(-100).to(torch::kDouble);
        LogitLossOptions o;
        o.kind = kind;
        o.temperature = temperature;
        o.chunk_tokens = 4;  // several chunks, one partial
        const double kd_factor = 0.7, ce_factor = 0.3;
        torch::Tensor total =
            logit_distillation_from_heads(
                {xs, ws}, {xt, wt}, weight, targets, kVocab, o, {}, {kd_factor, ce_factor},
                recompute ? HeadLogits::formed_again_in_backward : HeadLogits::gradient_in_forward)
                .total;
        total.backward();

        torch::Tensor xs_ref = xs.detach().clone().requires_grad_(true);
        torch::Tensor ws_ref = ws.detach().clone().requires_grad_(true);
        torch::Tensor s = torch::matmul(xs_ref, ws_ref.t()), t = torch::matmul(xt, wt.t());
        torch::Tensor kd_ref = (reference_logit_loss(s, t, kind, temperature) * weight).sum() *
                               temperature * temperature;
        torch::Tensor ce_ref = F::cross_entropy(
            s.narrow(-1, 0, kVocab), targets,
            F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100));
        torch::Tensor ref = kd_ref * kd_factor + ce_ref * ce_factor;
        ref.backward();
        const std::string where = std::to_string(int(kind)) + " T" + std::to_string(temperature) +
                                  (recompute ? " recomputed" : " gradient in forward");
        EXPECT_NEAR(total.item<double>(), ref.item<double>(), 1e-10) << where;
        EXPECT_TRUE(torch::allclose(xs.grad(), xs_ref.grad(), 1e-9, 1e-12)) << where;
        EXPECT_TRUE(torch::allclose(ws.grad(), ws_ref.grad(), 1e-9, 1e-12)) << where;
        EXPECT_EQ(ws.grad().narrow(0, kVocab, kPadded - kVocab).abs().max().item<double>(), 0.0)
            << where;  // padded rows get no gradient
      }
}

TEST(ActivationLosses, DistillerReleasesTheCapturesItsLossesUsed) {
  // Once the activation losses are built, neither sink holds the pairs' captures (the
  // student's would otherwise live through the logit loss's peak), and backward still works
  // from what the losses' graphs kept.
  layers::ModelConfig c;
  c.vocab_size = 40;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn_hidden = 24;
  layers::ParameterStore store(3, torch::kDouble);
  layers::LlamaModel student(c, store);
  Teacher teacher(c, 4, torch::kDouble, {});
  DistillConfig dc;
  dc.logit_weight = 0;
  dc.activation_weight = 1;
  dc.pairs = make_activation_pairs({}, {"mixer_output", "mlp_output"}, c.layers, c.layers);
  Distiller distiller(dc, &teacher, c, store, {});
  torch::Tensor tokens = torch::randint(c.vocab_size, {2, 8}, torch::kLong);
  layers::CaptureSink student_sink(distiller.student_captures()),
      teacher_sink(distiller.teacher_captures());
  teacher.forward(tokens, &teacher_sink);
  student.forward(tokens, &student_sink);
  for (const ActivationPair& pair : distiller.pairs()) ASSERT_TRUE(student_sink.has(pair.student));
  PendingTerms terms;
  torch::Tensor loss = distiller.activation_loss(tokens, student_sink, teacher_sink, 16.0, &terms);
  for (const ActivationPair& pair : distiller.pairs()) {
    EXPECT_FALSE(student_sink.has(pair.student)) << pair.student;
    EXPECT_FALSE(teacher_sink.has(pair.teacher)) << pair.teacher;
  }
  EXPECT_GT(loss.item<double>(), 0.0);  // different seeds: student and teacher differ
  loss.backward();
  double largest = 0;
  for (auto& p : store.all())
    if (p.value.grad().defined())
      largest = std::max(largest, p.value.grad().abs().max().item<double>());
  EXPECT_GT(largest, 0.0);
}

// The dense losses' one-pass float loops (kernels/logit_kernels.h) against float64 torch on
// the same float inputs (n tokens, hidden h, a vocabulary padded to `padded` rows, chunks of
// `chunk` tokens), both heads fused in, the logits formed again in backward or the gradient
// formed in forward. The bounds are float32
// round-off: relative 1e-5 on the totals, 1e-5 of the largest entry on gradients.
void expect_float_loops_match_float64(int64_t n, int64_t h, int64_t vocab, int64_t padded,
                                      int64_t chunk, LogitLoss kind, double temperature,
                                      HeadLogits form) {
  const bool with_ce = temperature == 1.0;
  torch::Tensor xs = torch::randn({n, h}).requires_grad_(true);
  torch::Tensor ws = (torch::randn({padded, h}) * 0.6).requires_grad_(true);
  torch::Tensor xt = torch::randn({n, h});
  torch::Tensor wt = torch::randn({padded, h}) * 0.6;
  torch::Tensor targets = torch::randint(vocab, {n}, torch::kLong);
  targets[3] = -100;
  torch::Tensor weight = targets.ne(-100).to(torch::kFloat);
  LogitLossOptions o;
  o.kind = kind;
  o.temperature = temperature;
  o.chunk_tokens = chunk;
  const double kd_factor = 0.6, ce_factor = with_ce ? 0.4 : 0.0;
  torch::Tensor total =
      logit_distillation_from_heads({xs, ws}, {xt, wt}, weight, with_ce ? targets : torch::Tensor(),
                                    vocab, o, {}, {kd_factor, ce_factor}, form)
          .total;
  total.backward();

  torch::Tensor xs_ref = xs.detach().to(torch::kDouble).requires_grad_(true);
  torch::Tensor ws_ref = ws.detach().to(torch::kDouble).requires_grad_(true);
  torch::Tensor s = torch::matmul(xs_ref, ws_ref.t()).narrow(1, 0, vocab);
  torch::Tensor t =
      torch::matmul(xt.to(torch::kDouble), wt.to(torch::kDouble).t()).narrow(1, 0, vocab);
  torch::Tensor log_q = torch::log_softmax(s / temperature, -1);
  torch::Tensor log_p = torch::log_softmax(t / temperature, -1);
  torch::Tensor per_token = kind == LogitLoss::forward_kl ? (log_p.exp() * (log_p - log_q)).sum(-1)
                                                          : -(log_p.exp() * log_q).sum(-1);
  torch::Tensor ref =
      (per_token * weight.to(torch::kDouble)).sum() * temperature * temperature * kd_factor;
  if (with_ce)
    ref = ref +
          F::cross_entropy(s, targets,
                           F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100)) *
              ce_factor;
  ref.backward();
  const std::string where =
      std::to_string(int(kind)) + " T" + std::to_string(temperature) +
      (form == HeadLogits::gradient_in_forward ? " gradient in forward" : " formed again");
  EXPECT_NEAR(total.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>()))
      << where;
  for (auto [got, want] : {std::pair{xs.grad(), xs_ref.grad()}, {ws.grad(), ws_ref.grad()}}) {
    const double scale = want.abs().max().item<double>();
    EXPECT_LT((got.to(torch::kDouble) - want).abs().max().item<double>(), 1e-5 * scale) << where;
  }
}

// A vocabulary of several of the loops' 512-value blocks and a partial one, padded, forward
// KL and soft cross-entropy, with the LM cross-entropy at T = 1 and without it at T = 2.
TEST(LogitLosses, FloatLoopsMatchFloat64Reference) {
  torch::manual_seed(11);
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::soft_ce})
    for (double temperature : {1.0, 2.0})
      for (HeadLogits form : kBothForms)
        expect_float_loops_match_float64(30, 24, 1300, 1312, 7, kind, temperature, form);
}

// Both heads fused in at the LM head's shapes: 256-token chunks (the logits by the tile loops
// where the CPU has them, layers/linear_products.h) and a vocabulary past 8192 (the input
// gradient by the BLAS), then a partial chunk of 44 tokens (the BLAS).
TEST(LogitLosses, FusedHeadsAtLmHeadShapesMatchFloat64Reference) {
  torch::manual_seed(12);
  expect_float_loops_match_float64(300, 40, 9000, 9024, 256, LogitLoss::forward_kl, 1.0,
                                   HeadLogits::gradient_in_forward);
}

// Student and teacher logits spread over hundreds, each row's largest in the vocabulary's last
// columns (past the last whole 16-lane block of 1300): both softmaxes are taken relative to
// their row maxima, so a maximum that missed those columns would overflow exp to inf and the
// losses to NaN. float32 kernels against float64 torch.
TEST(LogitLosses, SharpLogitsPeakingLastStayExact) {
  torch::manual_seed(12);
  const int64_t n = 9, vocab = 1300, padded = 1312;
  torch::Tensor s64 = torch::randn({n, padded}, torch::kDouble) * 30;
  torch::Tensor t64 = torch::randn({n, padded}, torch::kDouble) * 30;
  s64.select(1, vocab - 2).fill_(400.0);
  t64.select(1, vocab - 1).fill_(380.0);
  torch::Tensor targets = torch::randint(vocab, {n}, torch::kLong);
  torch::Tensor weight = torch::ones({n});
  LogitLossOptions o;
  o.chunk_tokens = 4;
  torch::Tensor s = s64.to(torch::kFloat).requires_grad_(true);
  LogitLossValue value = logit_loss_on_logits(s, t64.to(torch::kFloat), weight, targets, vocab, o,
                                              {}, {0.6, 0.4}, HeadLogits::gradient_in_forward);
  value.total.backward();
  const torch::Tensor kd = value.kd_sum, ce = value.ce_sum;

  torch::Tensor s_ref = s64.clone().requires_grad_(true);
  torch::Tensor log_q = torch::log_softmax(s_ref.narrow(1, 0, vocab), -1);
  torch::Tensor log_p = torch::log_softmax(t64.narrow(1, 0, vocab), -1);
  torch::Tensor ref_kd = (log_p.exp() * (log_p - log_q)).sum();
  torch::Tensor ref_ce = F::cross_entropy(s_ref.narrow(1, 0, vocab), targets,
                                          F::CrossEntropyFuncOptions().reduction(torch::kSum));
  (0.6 * ref_kd + 0.4 * ref_ce).backward();
  ASSERT_TRUE(std::isfinite(kd.item<double>()) && std::isfinite(ce.item<double>()));
  EXPECT_NEAR(kd.item<double>(), ref_kd.item<double>(), 1e-5 * ref_kd.item<double>());
  EXPECT_NEAR(ce.item<double>(), ref_ce.item<double>(), 1e-5 * ref_ce.item<double>());
  EXPECT_LT((s.grad().to(torch::kDouble) - s_ref.grad()).abs().max().item<double>(), 1e-5);
}

// bfloat16 heads: the logit loss takes its log-sum-exps, per-token terms and sums in float32,
// only the head products in bfloat16 (both forms). The reference is float64 on the logits the
// bf16 products give (float32 sums rounded once to bf16). Tolerances, u = 2^-8:
// - the loss: float32 arithmetic on those logits, with a product entry that rounds the other
//   way now and then (each moves one token's terms by about u |z|): 1e-4 of the total. Kept in
//   bf16, the statistics and sums miss by about u / 2 per token.
// - the gradients: the logit gradient rounded to bf16, then a bf16 product: 2u (|dz| @ |w|)
//   for the input; the weight's is summed over chunks in float32 and rounded to the bf16
//   weight once more: 3u (|dz|^T @ |x|).
TEST(LogitLosses, BFloat16HeadsTakeTheLossInFloat32) {
  torch::manual_seed(31);
  const int64_t n = 200, h = 48, vocab = 900, padded = 912;
  const double u = std::ldexp(1.0, -8), kd_factor = 0.6, ce_factor = 0.4;
  torch::Tensor xs = torch::randn({n, h}).to(torch::kBFloat16);
  torch::Tensor ws = (torch::randn({padded, h}) * 0.4).to(torch::kBFloat16);
  torch::Tensor xt = torch::randn({n, h}).to(torch::kBFloat16);
  torch::Tensor wt = (torch::randn({padded, h}) * 0.4).to(torch::kBFloat16);
  torch::Tensor targets = torch::randint(vocab, {n}, torch::kLong);
  targets[3] = -100;
  torch::Tensor weight = targets.ne(-100).to(torch::kFloat);
  for (HeadLogits form : kBothForms) {
    LogitLossOptions o;
    o.chunk_tokens = 64;
    torch::Tensor x = xs.clone().requires_grad_(true), w = ws.clone().requires_grad_(true);
    LogitLossValue value = logit_distillation_from_heads({x, w}, {xt, wt}, weight, targets, vocab,
                                                         o, {}, {kd_factor, ce_factor}, form);
    EXPECT_EQ(value.total.scalar_type(), torch::kFloat);
    value.total.backward();

    torch::Tensor s = torch::matmul(xs, ws.t()).to(torch::kDouble).narrow(1, 0, vocab);
    torch::Tensor t = torch::matmul(xt, wt.t()).to(torch::kDouble).narrow(1, 0, vocab);
    torch::Tensor log_q = torch::log_softmax(s, -1), log_p = torch::log_softmax(t, -1);
    torch::Tensor keep = weight.to(torch::kDouble);
    torch::Tensor safe = torch::where(targets.ne(-100), targets, torch::zeros_like(targets));
    torch::Tensor kd = ((log_p.exp() * (log_p - log_q)).sum(-1) * keep).sum();
    torch::Tensor ce = -(log_q.gather(1, safe.unsqueeze(1)).squeeze(1) * keep).sum();
    const std::string where =
        form == HeadLogits::gradient_in_forward ? "gradient in forward" : "formed again";
    EXPECT_NEAR(value.kd_sum.item<double>(), kd.item<double>(), 1e-4 * kd.item<double>()) << where;
    EXPECT_NEAR(value.ce_sum.item<double>(), ce.item<double>(), 1e-4 * ce.item<double>()) << where;

    torch::Tensor q = log_q.exp();
    torch::Tensor dz = (kd_factor * (q - log_p.exp()) +
                        ce_factor * (q - torch::one_hot(safe, vocab).to(torch::kDouble))) *
                       keep.unsqueeze(1);
    torch::Tensor w64 = ws.to(torch::kDouble).narrow(0, 0, vocab), x64 = xs.to(torch::kDouble);
    torch::Tensor gx_bound = 2 * u * torch::matmul(dz.abs(), w64.abs()) + 1e-6;
    EXPECT_TRUE(((x.grad().to(torch::kDouble) - torch::matmul(dz, w64)).abs() <= gx_bound)
                    .all()
                    .item<bool>())
        << where;
    torch::Tensor gw = w.grad().to(torch::kDouble);
    torch::Tensor gw_bound = 3 * u * torch::matmul(dz.abs().t(), x64.abs()) + 1e-6;
    EXPECT_TRUE(((gw.narrow(0, 0, vocab) - torch::matmul(dz.t(), x64)).abs() <= gw_bound)
                    .all()
                    .item<bool>())
        << where;
    EXPECT_EQ(gw.narrow(0, vocab, padded - vocab).abs().max().item<double>(), 0.0) << where;
  }
}
