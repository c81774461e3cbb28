// tests/mpi/logit_losses_split_test.cpp: the TP-split logit losses (the world is the TP
// group) against a single-process reference on the gathered vocabulary in double precision
// (torch log_softmax, kl_div, cross_entropy), with different random student and teacher
// logits, for every padding pattern: no padding, the last rank partly padded, and one rank
// partly padded with the ranks after it fully padded. Every kind, with and without
// temperature, top-k teacher and the fused LM cross-entropy; the loss value must be the
// reference's on every rank and each rank's gradient the reference gradient's slice (zero
// on padding), with the logits formed again in backward and with the gradient formed in
// forward.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "distill/logit_losses.h"
#include "parallel/communicator.h"
#include "tests/support/logit_loss_on_logits.h"

using namespace retort;
using namespace retort::distill;
namespace F = torch::nn::functional;

namespace {

constexpr int64_t kLocal = 16;  // vocabulary rows per rank (padded)

struct Case {
  LogitLoss kind;
  double temperature;
  int64_t top_k;
  bool with_ce;
};

// Per-token reference over the real vocabulary [n, vocab] at temperature T, with the teacher
// restricted to its top-k entries (renormalised) when top_k > 0.
torch::Tensor reference_per_token(const torch::Tensor& s, const torch::Tensor& t, const Case& c) {
  torch::Tensor log_q = torch::log_softmax(s / c.temperature, -1);
  torch::Tensor tt = t / c.temperature;
  if (c.top_k > 0) {
    torch::Tensor kth = std::get<0>(tt.topk(c.top_k, -1)).select(-1, c.top_k - 1).unsqueeze(-1);
    tt = tt.masked_fill(tt < kth, -std::numeric_limits<double>::infinity());
  }
  torch::Tensor log_p = torch::log_softmax(tt, -1);
  const auto none = F::KLDivFuncOptions().reduction(torch::kNone).log_target(true);
  switch (c.kind) {
    case LogitLoss::forward_kl:  // kl_div(input = log q, target = log p) = p (log p - log q)
      return torch::nan_to_num(F::kl_div(log_q, log_p, none), 0.0).sum(-1);
    case LogitLoss::reverse_kl:
      return F::kl_div(log_p, log_q, none).sum(-1);
    case LogitLoss::soft_ce:
      return -(log_p.exp() * log_q).sum(-1);
  }
  return {};
}

std::string describe(const Case& c, int64_t vocab) {
  const char* kinds[] = {"forward_kl", "reverse_kl", "soft_ce"};
  return std::string(kinds[int(c.kind)]) + " T=" + std::to_string(c.temperature) +
         " top_k=" + std::to_string(c.top_k) + (c.with_ce ? " +ce" : "") +
         " vocab=" + std::to_string(vocab);
}

}  // namespace

TEST(LogitLossesSplit, MatchGatheredVocabularyReference) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  parallel::Communicator comm(dup, "tp");
  const int tp = comm.size(), rank = comm.rank();
  ASSERT_GE(tp, 2);
  const layers::TensorParallel split{&comm, false};
  const int64_t padded = kLocal * tp;
  // No padding; the last rank partly padded; rank tp-2 partly padded and the last fully.
  const std::vector<int64_t> vocabularies = {padded, padded - 5, kLocal * (tp - 1) - 3};
  std::vector<Case> cases;
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::reverse_kl, LogitLoss::soft_ce})
    for (double temperature : {1.0, 2.5})
      for (int64_t top_k : {0, 5})
        for (bool with_ce : {false, true})
          if (!(top_k > 0 && kind == LogitLoss::reverse_kl))
            cases.push_back({kind, temperature, top_k, with_ce});
  int checked = 0;
  for (int64_t vocab : vocabularies)
    for (const Case& c : cases)
      for (distill::HeadLogits form : {distill::HeadLogits::gradient_in_forward,
                                       distill::HeadLogits::formed_again_in_backward}) {
        // The same full logits on every rank (one seed); each rank takes its slice.
        torch::manual_seed(1000 + vocab);
        const int64_t n = 21;  // several chunks of 8, one partial
        torch::Tensor s_full = torch::randn({n, padded}, torch::kDouble) * 2;
        torch::Tensor t_full = torch::randn({n, padded}, torch::kDouble) * 3 + 0.5;
        torch::Tensor targets = torch::randint(vocab, {n}, torch::kLong);
        targets[4] = -100;
        targets[17] = -100;
        torch::Tensor weight = targets.ne(-100).to(torch::kDouble);

        torch::Tensor s = s_full.narrow(1, rank * kLocal, kLocal).clone().requires_grad_(true);
        torch::Tensor t = t_full.narrow(1, rank * kLocal, kLocal).clone();
        LogitLossOptions o;
        o.kind = c.kind;
        o.temperature = c.temperature;
        o.chunk_tokens = 8;
        o.teacher_top_k = c.top_k;
        const double kd_weight = 0.7, ce_weight = 0.3;
        LogitLossValue value = retort::testing::logit_loss_on_logits(
            s, t, weight, c.with_ce ? targets : torch::Tensor(), vocab, o, split,
            {kd_weight, c.with_ce ? ce_weight : 0.0}, form);
        value.total.backward();
        const torch::Tensor kd = value.kd_sum, ce = value.ce_sum;

        torch::Tensor x = s_full.narrow(1, 0, vocab).clone().requires_grad_(true);
        torch::Tensor ref_kd =
            (reference_per_token(x, t_full.narrow(1, 0, vocab), c) * weight).sum() * c.temperature *
            c.temperature;
        torch::Tensor ref_ce = F::cross_entropy(
            x, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100));
        (c.with_ce ? kd_weight * ref_kd + ce_weight * ref_ce : kd_weight * ref_kd).backward();
        torch::Tensor ref_grad =
            torch::cat({x.grad(), torch::zeros({n, padded - vocab}, torch::kDouble)}, 1)
                .narrow(1, rank * kLocal, kLocal);

        const std::string what =
            describe(c, vocab) + " rank " + std::to_string(rank) +
            (form == distill::HeadLogits::gradient_in_forward ? " gradient in forward"
                                                              : " formed again");
        EXPECT_NEAR(kd.item<double>(), ref_kd.item<double>(),
                    1e-10 * (1 + ref_kd.abs().item<double>()))
            << what;
        if (c.with_ce)
          EXPECT_NEAR(ce.item<double>(), ref_ce.item<double>(), 1e-10 * ref_ce.item<double>())
              << what;
        EXPECT_TRUE(torch::allclose(s.grad(), ref_grad, 1e-9, 1e-12))
            << what << ": largest gradient difference "
            << (s.grad() - ref_grad).abs().max().item<double>();
        ++checked;
      }
  EXPECT_EQ(checked, int(2 * vocabularies.size() * cases.size()));
}
