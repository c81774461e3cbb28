// tests/mpi/memory_exactness_test.cpp: the memory features change where tensors live and when
// parameters step, never the numbers. For one seed, 5 steps of plain training and of
// distillation (forward KL + mse pairs through projections, 2 micro-batches where the layout
// accumulates) give the same losses and parameters with full and selective activation
// checkpointing, with offloading, with the optimizer step inside backward and with all of
// them together, with bf16 weight copies cast at each use and with a tied head's gradient
// deferred to the end of backward, as without any: bitwise where the two runs make the same
// calls on operands of the same shapes (full checkpointing of plain training; copies per use;
// the deferred head), otherwise losses within 1e-6 relative in fp32, the consistency suite's
// derived tolerance in bf16 mixed precision, and losses and parameters within a bound derived
// from float64 round-off (kFloat64Bound below). One rank runs TP1; two ranks run STP2, DP2
// without and with ZeRO-1, and PP2. Plain training runs with untied and with tied embeddings
// (the head rows the lookup reaches step last).
//
// Why the optimizer step inside backward is not bitwise: it forms the head's weight gradient
// and the logits it needs again block of vocabulary rows by block, where the plain step forms
// them for all rows at once. The products then have other shapes, and nothing but the BLAS's
// kernel choice decides whether a product of fewer rows sums each element in the same order:
// MKL's float64 kernels on an AMD Zen 4 CPU do not (docs/numerics.md, "Bitwise claims").
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/config/config.h"
#include "engine/consistency/consistency.h"
#include "engine/train/trainer.h"
#include "trainer_test_support.h"

using namespace retort;
using namespace retort::engine;
using retort::test::world_size;

namespace {

struct Run {
  std::vector<double> losses;
  std::vector<torch::Tensor> parameters;
};

Run train(const std::string& config_file, std::vector<std::string> overrides) {
  std::vector<std::string> all = {"data.paths=[" RETORT_TEST_CORPUS "]", "training.steps=5",
                                  "optimizer.grad_clip=0", "checkpoint.save_at_end=false",
                                  "training.eval_every=0"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  TrainConfig config = make_train_config(
      Config::load(std::string(RETORT_TEST_CONFIGS "/") + config_file, all), world_size());
  parallel::Mesh mesh(config.layout);
  Trainer trainer(config, nullptr, mesh);
  Run run;
  for (int i = 0; i < 5; ++i) run.losses.push_back(trainer.train_step().loss);
  for (auto& p : trainer.parameters().all()) run.parameters.push_back(p.value.clone());
  // Optimizer-in-backward on the head's stage steps the fused head's weight block by block
  // (the LM head, or the student's in the logit loss); with tied embeddings some rows wait for
  // the lookup.
  if (config.optimizer.in_backward && trainer.stage().head) {
    const HeadRowStepper* stepper = trainer.head_stepper();
    const bool tied_copy = config.model.tied_embeddings && !trainer.stage().embedding;
    EXPECT_EQ(stepper != nullptr, !tied_copy);
    if (stepper) {
      EXPECT_GT(stepper->rows_streamed(), 0);
      // TP rank 0 holds the low token ids the byte corpus uses; rank 1 may hold none.
      if (trainer.tensor_parallel().rank() == 0 || !config.model.tied_embeddings)
        EXPECT_EQ(stepper->rows_kept() > 0, config.model.tied_embeddings);
    }
  }
  if (layers::ActivationOffloader* offloader = trainer.offloader()) {
    EXPECT_GT(offloader->moved_out(), 0);
    EXPECT_EQ(offloader->moved_out(), offloader->moved_back());  // everything came back
    EXPECT_EQ(offloader->pending(), 0u);
  }
  return run;
}

// Two summation orders of n terms differ by at most 2 gamma_n sum|terms|, gamma_n = n u / (1 - n
// u), u = 2^-53 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1). The sums that may
// change order: the head's logits over hidden = 64 terms (2 x 64 u = 1.4e-14) and its weight
// gradient over a chunk of at most 256 tokens (2 x 256 u = 5.7e-14), 7.1e-14 of the terms'
// magnitudes per step in all. AdamW's update m / (sqrt(v) + eps) is homogeneous of degree 0 in
// the gradient where |g| >> eps, so a relative change of g moves the update by at most about
// twice as much; where |g| <~ eps (1e-6 here) by at most lr |dg| / eps, below 1e-16 absolute.
// Five steps: 5 x 2 x 7.1e-14 = 7.1e-13 < 1e-12, relative to each tensor's largest magnitude
// (above its terms'). Measured: at most 1.0e-13 (Zen 4); 0 where the kernels keep one order.
// Other reorderings (selective recomputation's q, k, v gradient sum: 3 terms) stay far below.
// A real difference is far outside: the first block's gradient formed for rows offset by one
// moves parameters by 4.6e-2 relative (and fp32's losses by 1.7e-4).
constexpr double kFloat64Bound = 1e-12;

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

struct Variant {
  std::string name;
  std::vector<std::string> keys;
  // The same calls on operands of the same shapes as without it, so the same results on any
  // machine. Selective recomputation releases the q, k and v gradients together, which changes
  // the order of their sum; the optimizer step inside backward forms the head's products in
  // blocks of vocabulary rows (other shapes: the BLAS's kernels decide the order).
  bool bitwise;
  // Also forms the distillation heads' logits in other chunks (full checkpointing: in
  // backward): bitwise for plain training only.
  bool fuses_heads = false;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"full", {"memory.activation_checkpointing=full"}, true, true},
      {"selective", {"memory.activation_checkpointing=selective"}, false},
      {"full+offload",
       {"memory.activation_checkpointing=full", "memory.activation_offloading=true"},
       true,
       true},
      {"selective+offload",
       {"memory.activation_checkpointing=selective", "memory.activation_offloading=true"},
       false},
      // The head's logits and weight gradient formed again in backward in blocks of vocabulary
      // rows: the products change shape (the BLAS picks its kernel, and order, by shape).
      {"in_backward", {"optimizer.in_backward=true"}, false},
      {"all",
       {"memory.activation_checkpointing=full", "memory.activation_offloading=true",
        "optimizer.in_backward=true"},
       false},
      // The same casts of the same weights, at each use instead of once per step (bf16 only;
      // fp32 and float64 have no copies).
      {"copies_per_use", {"memory.keep_compute_weights=false"}, true},
      // The streamed head then casts each block of rows alone.
      {"in_backward+per_use",
       {"optimizer.in_backward=true", "memory.keep_compute_weights=false"},
       false},
      // The tied head's gradient formed at the lookup's backward in blocks of
      // max(256, 2^20 / chunk) vocabulary rows: at these vocabularies (256, 128 per TP rank)
      // one block of all rows, the plain step's shapes.
      {"head_deferred", {"memory.defer_head_gradient=true"}, true},
  };
  return v;
}

std::vector<std::pair<std::string, std::vector<std::string>>> layouts() {
  if (world_size() == 1) return {{"TP1", {}}};
  if (world_size() == 2)
    return {{"STP2", {"parallel.tensor=2", "parallel.sequence_parallel=true"}},
            {"DP2", {"parallel.data=2"}},
            {"DP2-Z1", {"parallel.data=2", "optimizer.zero_stage=1"}},
            {"PP2", {"parallel.pipeline=2"}}};
  return {};
}

void expect_variants_match_plain(const std::string& config_file, bool distilling,
                                 const std::vector<std::string>& model_keys = {}) {
  ASSERT_FALSE(layouts().empty()) << "run with 1 or 2 ranks";
  for (const auto& [layout, layout_keys] : layouts())
    for (const std::string dtype : {"float32", "float64", "bfloat16"}) {
      // bf16: the consistency suite's loss tolerance for these configs (5 layers, 8 x 32
      // tokens), derived from bf16's round-off (engine/consistency/consistency.h).
      const double tolerance = dtype == "float32" ? 1e-6
                               : dtype == "float64"
                                   ? kFloat64Bound
                                   : retort::engine::tolerances_for(dtype, 5, 256).loss;
      std::vector<std::string> base = layout_keys;
      base.insert(base.end(), model_keys.begin(), model_keys.end());
      base.push_back("model.dtype=" + dtype);
      const Run plain = train(config_file, base);
      for (const Variant& variant : variants()) {
        std::vector<std::string> keys = base;
        keys.insert(keys.end(), variant.keys.begin(), variant.keys.end());
        const Run run = train(config_file, keys);
        const std::string where = config_file + " " + layout + " " + dtype + " " + variant.name;
        double worst = 0, worst_loss = 0;
        bool identical = true;
        for (size_t s = 0; s < plain.losses.size(); ++s) {
          identical &= run.losses[s] == plain.losses[s];
          worst_loss = std::max(
              worst_loss, std::abs(run.losses[s] - plain.losses[s]) / std::abs(plain.losses[s]));
        }
        worst = worst_loss;
        for (size_t i = 0; i < plain.parameters.size(); ++i) {
          identical &= torch::equal(run.parameters[i], plain.parameters[i]);
          worst = std::max(worst, relative_difference(run.parameters[i], plain.parameters[i]));
        }

        const bool bitwise = variant.bitwise && !(distilling && variant.fuses_heads);
        if (bitwise) EXPECT_TRUE(identical) << where << ": not bitwise, " << worst;
        // In fp32, Adam turns round-off in near-zero gradient elements into updates of up to
        // lr (eps 1e-6, configs/consistency.yaml), so a changed summation order moves a few
        // parameters by ~1e-5 relative after 5 steps; float64 holds the same difference to
        // kFloat64Bound. fp32 and bf16 compare the losses, float64 everything.
        EXPECT_LE(dtype == "float64" ? worst : worst_loss, tolerance) << where;
        if (retort::test::world_rank() == 0)
          std::printf("%-26s %-7s %-7s %-18s %s (losses %.1e, parameters %.1e relative)\n",
                      config_file.c_str(), layout.c_str(), dtype.c_str(), variant.name.c_str(),
                      identical ? "bitwise" : "differs", worst_loss, worst);
      }
    }
}

}  // namespace

TEST(MemoryExactness, PlainTraining) {
  expect_variants_match_plain("consistency.yaml", false);
}

// Tied: the head's rows that the embedding lookup also reaches step last.
TEST(MemoryExactness, PlainTrainingTiedEmbeddings) {
  expect_variants_match_plain("consistency.yaml", false, {"model.tied_embeddings=true"});
}

TEST(MemoryExactness, Distillation) {
  expect_variants_match_plain("consistency_distill.yaml", true);
}
