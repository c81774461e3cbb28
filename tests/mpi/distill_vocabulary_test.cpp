// tests/mpi/distill_vocabulary_test.cpp: a student and a teacher of one tokenizer whose
// vocabularies differ (student 150 under a teacher of 160, and 160 under 150), padded alike
// (layers::pad_vocabularies_alike; 120 and 130 would be padded to 128 and 256 rows apart), under
// TP1, TP2 and STP2 (world = TP group), in float64: the logit loss over the ids both have and the
// LM loss over the student's own equal a float64 computation from the whole models' logits cut to
// those ids, for the forward KL, the reverse KL and the soft cross-entropy; under TP1 every student
// gradient equals that computation's autograd.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "distill/distillation.h"
#include "parallel/communicator.h"
#include "tp_layouts.h"
#include "world_group.h"

using namespace retort;
using namespace retort::distill;

namespace {

layers::ModelConfig model_config(int64_t vocab, int64_t hidden) {
  layers::ModelConfig c;
  c.vocab_size = vocab;
  c.hidden = hidden;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 64;
  c.init_std = 0.2;
  return c;
}

DistillConfig objective(LogitLoss kind) {
  DistillConfig dc;
  dc.lm_weight = 0.5;
  dc.logit_weight = 1;
  dc.logits.kind = kind;
  dc.logits.temperature = 2.0;  // scaled by T^2 (distill.scale_t2's default)
  dc.logits.chunk_tokens = 5;   // several chunks
  return dc;
}

struct Batch {
  torch::Tensor tokens, targets;
  double target_count = 0;
};

// Ids below both vocabularies, as the data is (ids beyond the smaller one stop a run).
Batch batch(int64_t shared) {
  torch::manual_seed(5);
  Batch b;
  b.tokens = torch::randint(shared, {2, 10}, torch::kLong);
  b.targets = torch::randint(shared, {2, 10}, torch::kLong);
  b.targets[0][3] = layers::kIgnoreIndex;
  b.target_count = double(b.targets.ne(layers::kIgnoreIndex).sum().item<int64_t>());
  return b;
}

// The float64 computation: both whole models' logits (TP1) cut to the shared ids for the logit
// loss and to the student's own for the LM loss. Returns {logit loss, LM loss}, each over
// target_count.
std::pair<torch::Tensor, torch::Tensor> reference(const layers::LlamaModel& student,
                                                  const Teacher& teacher, const Batch& b,
                                                  LogitLoss kind) {
  const int64_t shared = std::min(student.config().vocab_size, teacher.config().vocab_size);
  const double t = 2.0;
  torch::Tensor s_logits =
      student.head_logits(student.run_blocks(student.embed(b.tokens), b.tokens.size(1), nullptr));
  torch::Tensor t_logits;
  {
    torch::NoGradGuard no_grad;
    t_logits = teacher.forward(b.tokens, nullptr);
  }
  const torch::Tensor log_q = torch::log_softmax(s_logits.narrow(-1, 0, shared) / t, -1);
  const torch::Tensor log_p = torch::log_softmax(t_logits.narrow(-1, 0, shared) / t, -1);
  torch::Tensor per_token;
  switch (kind) {
    case LogitLoss::forward_kl:
      per_token = (log_p.exp() * (log_p - log_q)).sum(-1);
      break;
    case LogitLoss::reverse_kl:
      per_token = (log_q.exp() * (log_q - log_p)).sum(-1);
      break;
    case LogitLoss::soft_ce:
      per_token = -(log_p.exp() * log_q).sum(-1);
      break;
  }
  const torch::Tensor counted = b.targets.ne(layers::kIgnoreIndex).to(torch::kDouble);
  const torch::Tensor kd = (per_token * counted).sum() * (t * t) / b.target_count;
  const torch::Tensor log_s =
      torch::log_softmax(s_logits.narrow(-1, 0, student.config().vocab_size), -1);
  const torch::Tensor safe_targets = b.targets.clamp_min(0).unsqueeze(-1);
  const torch::Tensor lm =
      -(log_s.gather(-1, safe_targets).squeeze(-1) * counted).sum() / b.target_count;
  return {kd, lm};
}

void check(int64_t student_vocab, int64_t teacher_vocab, const std::string& name,
           const layers::TensorParallel& tp) {
  layers::ModelConfig sc = model_config(student_vocab, 32), tc = model_config(teacher_vocab, 48);
  layers::pad_vocabularies_alike(sc, tc);
  const Batch b = batch(std::min(student_vocab, teacher_vocab));
  for (LogitLoss kind : {LogitLoss::forward_kl, LogitLoss::reverse_kl, LogitLoss::soft_ce}) {
    SCOPED_TRACE(name + " student " + std::to_string(student_vocab) + ", teacher " +
                 std::to_string(teacher_vocab) + ", loss " + std::to_string(int(kind)));
    layers::ParameterStore store(77, torch::kDouble, tp.position());
    layers::LlamaModel student(sc, store, tp);
    Teacher teacher(tc, 78, torch::kDouble, tp);
    Distiller distiller(objective(kind), &teacher, sc, store, tp);
    PendingTerms pending;
    torch::Tensor x = student.run_blocks(student.embed(b.tokens), b.tokens.size(1), nullptr);
    torch::Tensor t = teacher.run_blocks(teacher.embed(b.tokens), b.tokens.size(1), nullptr);
    torch::Tensor loss = distiller.output_loss(
        {student.head_input(x), student.head_weight()}, teacher.head_input(t), b.targets,
        b.target_count, student_vocab, /*lm_chunk_tokens=*/4, false, &pending);
    LossTerms terms;
    pending.settle_into(terms);

    // The reference on one rank, from the same seeds (values do not depend on the layout).
    layers::ParameterStore whole_store(77, torch::kDouble);
    layers::LlamaModel whole_student(sc, whole_store);
    Teacher whole_teacher(tc, 78, torch::kDouble, {});
    auto [kd, lm] = reference(whole_student, whole_teacher, b, kind);
    EXPECT_NEAR(terms.logits, kd.item<double>(), 1e-12 * std::abs(kd.item<double>()));
    EXPECT_NEAR(terms.lm, lm.item<double>(), 1e-12 * std::abs(lm.item<double>()));
    EXPECT_NEAR(loss.item<double>(), (kd + 0.5 * lm).item<double>(), 1e-12 * loss.item<double>());
    if (tp.size() > 1) continue;
    loss.backward();
    (kd + 0.5 * lm).backward();
    for (size_t k = 0; k < store.all().size(); ++k) {
      const torch::Tensor& got = store.all()[k].value.grad();
      const torch::Tensor& want = whole_store.all()[k].value.grad();
      ASSERT_TRUE(got.defined() && want.defined()) << store.all()[k].spec.name;
      EXPECT_LE((got - want).abs().max().item<double>(), 1e-12 * want.abs().max().item<double>())
          << store.all()[k].spec.name;
    }
  }
}

}  // namespace

TEST(DistillVocabulary, LossesOverSharedIdsMatchFloat64UnderTp1Tp2Stp2) {
  parallel::Communicator comm(dup_world(), "tp");
  for (const auto& [name, tp] : test::tp_layouts(comm)) {
    check(150, 160, name, tp);  // the teacher's vocabulary padded further
    check(160, 150, name, tp);  // the student's: its LM loss over its own 160 ids
    check(120, 130, name, tp);  // apart, 128 and 256 rows: padded alike, both 256
    check(130, 120, name, tp);
  }
}
