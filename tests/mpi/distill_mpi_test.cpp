// tests/mpi/distill_mpi_test.cpp: a student identical to its teacher (same specs, same
// seed) under TP1, TP2 and STP2 (world = TP group): every distillation loss is <= 1e-6
// (soft cross-entropy equals the teacher's entropy, so for it only the gradient is checked)
// and every student gradient from the distillation losses is <= 1e-7 in absolute value.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "distill/distillation.h"
#include "engine/optim/grad_sync.h"
#include "parallel/communicator.h"
#include "tp_layouts.h"
#include "world_group.h"

using namespace retort;
using namespace retort::distill;

namespace {

layers::ModelConfig model_config() {
  layers::ModelConfig c;
  c.vocab_size = 200;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 64;
  c.init_std = 0.2;
  return c;
}

// Largest |gradient| over the student's parameters after one distillation backward.
double run_identical(const layers::TensorParallel& tp, LogitLoss logit_kind,
                     ActivationLoss activation_kind, LossTerms* terms) {
  const layers::ModelConfig c = model_config();
  layers::ParameterStore store(77, torch::kFloat, tp.position());
  layers::LlamaModel student(c, store, tp);
  Teacher teacher(c, 77, torch::kFloat, tp);
  DistillConfig dc;
  dc.lm_weight = 0;
  dc.logit_weight = 1;
  dc.activation_weight = 1;
  dc.logits.kind = logit_kind;
  dc.logits.temperature = 2.0;
  dc.activation_kind = activation_kind;
  dc.pairs =
      make_activation_pairs({}, {"mixer_output", "mlp_output", "block_output"}, c.layers, c.layers);
  Distiller distiller(dc, &teacher, c, store, tp);
  torch::manual_seed(5);
  torch::Tensor tokens = torch::randint(c.vocab_size, {2, 16}, torch::kLong);
  torch::Tensor targets = torch::randint(c.vocab_size, {2, 16}, torch::kLong);
  targets[0][3] = layers::kIgnoreIndex;
  layers::CaptureSink teacher_sink(distiller.teacher_captures());
  layers::CaptureSink student_sink(distiller.student_captures());
  torch::Tensor t = teacher.run_blocks(teacher.embed(tokens), tokens.size(1), &teacher_sink);
  torch::Tensor x = student.run_blocks(student.embed(tokens), tokens.size(1), &student_sink);
  PendingTerms pending;
  torch::Tensor loss =
      distiller.activation_loss(targets, student_sink, teacher_sink, 31.0, &pending) +
      distiller.output_loss({student.head_input(x), student.head_weight()}, teacher.head_input(t),
                            targets, 31.0, c.vocab_size, 0, false, &pending);
  pending.settle_into(*terms);
  loss.backward();
  engine::sum_partial_tp_grads(store, tp);
  double largest = 0;
  for (auto& p : store.all())
    largest = std::max(largest, p.value.grad().abs().max().item<double>());
  return largest;
}

}  // namespace

TEST(DistillIdentical, LossesAndGradientsVanishUnderTp1Tp2Stp2) {
  parallel::Communicator comm(dup_world(), "tp");
  for (const auto& [name, tp] : test::tp_layouts(comm)) {
    for (LogitLoss logit : {LogitLoss::forward_kl, LogitLoss::reverse_kl, LogitLoss::soft_ce}) {
      for (ActivationLoss act : {ActivationLoss::mse, ActivationLoss::cosine, ActivationLoss::l2}) {
        LossTerms terms;
        const double largest = run_identical(tp, logit, act, &terms);
        if (logit != LogitLoss::soft_ce) {
          EXPECT_LE(std::abs(terms.logits), 1e-6) << name;
        }
        EXPECT_LE(std::abs(terms.activations), 1e-6) << name << " activation " << int(act);
        for (const auto& [pair, value] : terms.per_pair) EXPECT_LE(std::abs(value), 1e-6) << pair;
        EXPECT_LE(largest, 1e-7) << name << " logit " << int(logit) << " activation " << int(act);
      }
    }
  }
}
