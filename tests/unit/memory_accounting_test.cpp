// tests/unit/memory_accounting_test.cpp: the tracking allocator files every byte under what it
// is for. Building a distillation trainer adds exactly its parameter bytes (student and
// projections) under parameters, the teacher's under teacher_weights and AdamW's state under
// optimizer_state; a step's peak holds student activations, teacher activations and
// gradients no larger than the trainable parameters; offloading moves bytes into the host
// store only when switched on and, with full checkpointing, lowers the activation peak, which
// moves late into backward where gradients pile up; the optimizer step inside backward then
// lowers the gradient bytes at the peak. A head tied to the embedding sums its gradient and
// the lookup's in place. bf16 weight copies cast at each use are not held past their products,
// and a deferred tied head's gradient is not held through forward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/config/config.h"
#include "engine/observe/memory_tracker.h"
#include "engine/train/trainer.h"
#include "layers/compute_copy.h"
#include "layers/model.h"

using namespace retort;
using namespace retort::engine;

namespace {

TrainConfig distill_config(std::vector<std::string> overrides) {
  std::vector<std::string> all = {
      "data.paths=[" RETORT_TEST_CORPUS "]", "training.steps=2",      "training.eval_every=0",
      "checkpoint.save_at_end=false",        "optimizer.grad_clip=0", "training.micro_batch=8"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return make_train_config(Config::load(RETORT_TEST_CONFIGS "/consistency_distill.yaml", all), 1);
}

int64_t bytes_of(const layers::ParameterStore& store, bool trainable_only) {
  int64_t bytes = 0;
  for (const auto& p : store.all())
    if (!trainable_only || !p.spec.frozen()) bytes += p.value.numel() * p.value.element_size();
  return bytes;
}

// The split at the peak of the second step (the first allocates lazily created state).
MemorySplit second_step_peak(const std::vector<std::string>& overrides,
                             int64_t* offloaded = nullptr) {
  MemoryTracker& tracker = MemoryTracker::install();
  Trainer trainer(distill_config(overrides), nullptr);
  trainer.train_step();
  tracker.reset_peak();
  trainer.train_step();
  if (offloaded) *offloaded = tracker.peak_offloaded_bytes();
  return tracker.peak_split();
}

}  // namespace

TEST(MemoryAccounting, ConstructionFilesParametersTeacherAndOptimizerState) {
  MemoryTracker& tracker = MemoryTracker::install();
  const MemorySplit before = tracker.current_split();
  Trainer trainer(distill_config({}), nullptr);
  const MemorySplit after = tracker.current_split();
  auto added = [&](MemoryCategory c) { return after.of(c) - before.of(c); };
  EXPECT_EQ(added(MemoryCategory::parameters), bytes_of(trainer.parameters(), false));
  EXPECT_EQ(added(MemoryCategory::teacher_weights), trainer.teacher()->weight_bytes());
  EXPECT_EQ(added(MemoryCategory::optimizer_state), trainer.optimizer().state_bytes());
  EXPECT_GT(trainer.teacher()->weight_bytes(), bytes_of(trainer.parameters(), false));
}

TEST(MemoryAccounting, PeakSplitAndWhatEachFeatureLowers) {
  int64_t offloaded = 0;
  Trainer reference(distill_config({}), nullptr);
  const int64_t trainable = bytes_of(reference.parameters(), true);

  const MemorySplit plain = second_step_peak({}, &offloaded);
  EXPECT_EQ(offloaded, 0);
  EXPECT_GT(plain.of(MemoryCategory::activations), 0);
  EXPECT_GT(plain.of(MemoryCategory::teacher_activations), 0);
  EXPECT_LE(plain.of(MemoryCategory::gradients), trainable);

  const MemorySplit full_offload = second_step_peak(
      {"memory.activation_checkpointing=full", "memory.activation_offloading=true"}, &offloaded);
  EXPECT_GT(offloaded, 0);
  EXPECT_LT(full_offload.of(MemoryCategory::activations), plain.of(MemoryCategory::activations));
  EXPECT_LT(full_offload.device(), plain.device());

  // With activations out of the way the peak moves late into backward, where gradients
  // pile up unless each is stepped and freed as soon as it is final.
  EXPECT_GT(full_offload.of(MemoryCategory::gradients), trainable / 2);
  const MemorySplit in_backward =
      second_step_peak({"memory.activation_checkpointing=full", "memory.activation_offloading=true",
                        "optimizer.in_backward=true"});
  EXPECT_LT(in_backward.of(MemoryCategory::gradients),
            full_offload.of(MemoryCategory::gradients) / 2);
  EXPECT_LT(in_backward.device(), full_offload.device());
  std::printf(
      "peak bytes  plain: activations %lld gradients %lld total %lld\n"
      "            full+offload: activations %lld gradients %lld total %lld (host %lld)\n"
      "            + in_backward: gradients %lld total %lld\n",
      (long long)plain.of(MemoryCategory::activations),
      (long long)plain.of(MemoryCategory::gradients), (long long)plain.device(),
      (long long)full_offload.of(MemoryCategory::activations),
      (long long)full_offload.of(MemoryCategory::gradients), (long long)full_offload.device(),
      (long long)offloaded, (long long)in_backward.of(MemoryCategory::gradients),
      (long long)in_backward.device());
}

// oneDNN takes its buffers through c10's raw_allocate / raw_deallocate, which need plain
// blocks (context == data): the tracker files those bytes too, and a bfloat16 matrix
// product (oneDNN's) runs with it installed. The product is checked against float32 on the
// same bfloat16 inputs: oneDNN sums in float32 and rounds once to bfloat16, so each entry is
// within bfloat16's unit round-off 2^-8 of the float32 result, plus float32's summation error
// over 96 terms (96 x 2^-24 x sum |a||b|, below 1e-4 here).
TEST(MemoryAccounting, RawBlocksAreFiledAndBFloat16ProductsRun) {
  MemoryTracker& memory = MemoryTracker::install();
  c10::Allocator* cpu = c10::GetAllocator(c10::DeviceType::CPU);  // what oneDNN asks
  const int64_t before = memory.current_bytes();
  void* raw = cpu->raw_allocate(1 << 20);
  EXPECT_EQ(memory.current_bytes() - before, 1 << 20);
  cpu->raw_deallocate(raw);
  EXPECT_EQ(memory.current_bytes(), before);

  torch::manual_seed(3);
  torch::Tensor a = torch::randn({64, 96}).to(torch::kBFloat16);
  torch::Tensor b = torch::randn({96, 80}).to(torch::kBFloat16);
  torch::Tensor product = torch::matmul(a, b);
  torch::Tensor reference = torch::matmul(a.to(torch::kFloat), b.to(torch::kFloat));
  EXPECT_TRUE(((product.to(torch::kFloat) - reference).abs() <=
               reference.abs() * std::ldexp(1.0, -8) + 1e-4)
                  .all()
                  .item<bool>());
  EXPECT_EQ(memory.current_bytes(),
            before + product.nbytes() + a.nbytes() + b.nbytes() + reference.nbytes());
}

// Each category's own peak is kept apart from the split at the device peak: activations that
// peak early and are freed before a larger allocation of another category still show their
// largest.
TEST(MemoryAccounting, CategoryPeaksAreEachCategorysOwnLargest) {
  MemoryTracker& memory = MemoryTracker::install();
  memory.reset_peak();
  const MemorySplit start = memory.current_split();
  {
    MemoryScope scope(MemoryCategory::activations);
    torch::Tensor saved = torch::empty({1 << 18});  // 1 MiB, freed below
  }
  torch::Tensor later;
  {
    MemoryScope scope(MemoryCategory::gradients);
    later = torch::empty({1 << 19});  // 2 MiB: the device peak
  }
  EXPECT_EQ(memory.peak_split().of(MemoryCategory::activations),
            start.of(MemoryCategory::activations));
  EXPECT_EQ(memory.category_peaks().of(MemoryCategory::activations),
            start.of(MemoryCategory::activations) + (int64_t(1) << 20));
  EXPECT_EQ(memory.category_peaks().of(MemoryCategory::gradients),
            start.of(MemoryCategory::gradients) + (int64_t(2) << 20));
}

// With the head tied to the embedding, backward adds the lookup's row-sparse gradient into
// the head's dense one in place: no second [vocab, h] gradient is ever allocated, in either
// micro-batch (the first's gradient becomes .grad(), the second's adds into it). Autograd,
// given both, would sum them out of place.
TEST(MemoryAccounting, TiedHeadAndLookupGradientsSumInPlace) {
  MemoryTracker& tracker = MemoryTracker::install();
  const TrainConfig config = make_train_config(
      Config::load(RETORT_TEST_CONFIGS "/tiny.yaml",
                   {"data.paths=[" RETORT_TEST_CORPUS "]", "model.vocab_size=4096",
                    "model.hidden=64", "model.layers=2", "model.ffn_hidden=128",
                    "model.tied_embeddings=true", "data.seq_len=32", "training.micro_batch=2",
                    "training.global_batch=4", "training.eval_every=0",
                    "checkpoint.save_at_end=false", "memory.activation_checkpointing=full"}),
      1);
  Trainer trainer(config, nullptr);
  trainer.train_step();
  const int64_t other_before = tracker.current_split().of(MemoryCategory::other);
  tracker.reset_peak();
  trainer.train_step();
  int64_t head_gradient_bytes = 0;  // the embedding's, which is the head
  for (const auto& p : trainer.parameters().all())
    if (p.spec.name == "embed.weight")
      head_gradient_bytes = p.value.numel() * int64_t(sizeof(float));
  ASSERT_EQ(head_gradient_bytes, 4096 * 64 * int64_t(sizeof(float)));
  EXPECT_LT(tracker.category_peaks().of(MemoryCategory::other) - other_before,
            head_gradient_bytes / 2);
}

namespace {

layers::ModelConfig tied_model(int64_t vocab) {
  layers::ModelConfig c;
  c.vocab_size = vocab;
  c.hidden = 64;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 172;
  c.tied_embeddings = true;
  c.init_std = 0.2;
  return c;
}

// The fused head's loss through the tied sink, as the trainer runs it.
torch::Tensor tied_head_loss(const layers::LlamaModel& model, const torch::Tensor& tokens,
                             const torch::Tensor& targets) {
  return model.head_loss_sum(model.run_blocks(model.embed(tokens), tokens.size(1), nullptr),
                             targets, model.tied_head_sink());
}

}  // namespace

// memory.keep_compute_weights=false: no bf16 copy of a weight is held once forward is over (the
// products save the main weight and cast again in backward), and the gradients are bitwise those
// of kept copies (the same casts of the same weights).
TEST(MemoryAccounting, ComputeCopiesCastAtEachUseAreNotHeldAndChangeNoGradient) {
  MemoryTracker& tracker = MemoryTracker::install();
  const layers::ModelConfig config = tied_model(512);
  torch::manual_seed(11);
  const torch::Tensor tokens = torch::randint(0, config.vocab_size, {2, 32}, torch::kLong);
  const torch::Tensor targets = torch::randint(0, config.vocab_size, {2, 32}, torch::kLong);
  std::vector<torch::Tensor> gradients[2];
  int64_t copies_after_forward[2];
  int64_t large_weights = 0;  // the matrices, whose products run in bf16
  for (int keep = 1; keep >= 0; --keep) {
    layers::RunContext run;
    run.copies.set_kept(keep);
    layers::ParameterStore store(7, torch::kFloat);
    layers::LlamaModel model(config, store);
    layers::KernelPolicy kernels;
    kernels.run = &run;
    model.set_kernels(kernels);
    model.set_types(torch::kBFloat16, torch::kBFloat16);
    const int64_t before = tracker.current_split().of(MemoryCategory::compute_weights);
    const torch::Tensor loss = tied_head_loss(model, tokens, targets);
    copies_after_forward[keep] =
        tracker.current_split().of(MemoryCategory::compute_weights) - before;
    loss.backward();
    for (const layers::Parameter& p : store.all()) {
      gradients[keep].push_back(p.value.grad());
      if (keep && p.value.dim() == 2) large_weights += p.value.numel() * 2;
    }
  }
  EXPECT_GE(copies_after_forward[1], large_weights);  // kept: every matrix's copy
  EXPECT_EQ(copies_after_forward[0], 0);
  ASSERT_EQ(gradients[0].size(), gradients[1].size());
  for (size_t i = 0; i < gradients[0].size(); ++i)
    EXPECT_TRUE(torch::equal(gradients[0][i], gradients[1][i])) << "parameter " << i;
}

// memory.defer_head_gradient: the tied head's weight gradient is formed at the lookup's backward,
// in blocks of vocabulary rows (three here, the last with padding rows; some targets ignored).
// The gradients match the unfused head's (full logits and autograd, float64); the gradient bytes
// held at the end of forward, [vocab, h] without deferring, are none; and the step's peak is
// lower by about that much, as the activations here outweigh the gradients.
TEST(MemoryAccounting, DeferredTiedHeadGradientMatchesAndIsNotHeldThroughForward) {
  MemoryTracker& tracker = MemoryTracker::install();
  const layers::ModelConfig config = tied_model(600);
  torch::manual_seed(12);
  const torch::Tensor tokens = torch::randint(0, config.vocab_size, {8, 64}, torch::kLong);
  torch::Tensor targets = torch::randint(0, config.vocab_size, {8, 64}, torch::kLong);
  targets.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, 5)}, -100);
  const int64_t head_bytes = layers::padded_vocab_size(600, 1) * 64 * int64_t(sizeof(double));
  auto run = [&](int64_t chunk_tokens, bool defer, int64_t* held_after_forward, int64_t* peak) {
    layers::ParameterStore store(7, torch::kDouble);
    layers::LlamaModel model(config, store);
    model.set_head_chunk_tokens(chunk_tokens);
    EXPECT_TRUE(model.set_defer_head_gradient(defer));
    const int64_t before = tracker.current_split().of(MemoryCategory::gradients);
    tracker.reset_peak();
    const int64_t start = tracker.current_bytes();
    const torch::Tensor loss = tied_head_loss(model, tokens, targets);
    if (held_after_forward)
      *held_after_forward = tracker.current_split().of(MemoryCategory::gradients) - before;
    loss.backward();
    if (peak) *peak = tracker.peak_bytes() - start;
    std::vector<torch::Tensor> gradients;
    for (const layers::Parameter& p : store.all()) gradients.push_back(p.value.grad());
    return gradients;
  };
  int64_t held_plain = 0, held_deferred = 0, peak_plain = 0, peak_deferred = 0;
  // A chunk of 4096 tokens makes the deferred blocks 256 rows (2^20 logits per chunk).
  const auto plain = run(4096, false, &held_plain, &peak_plain);
  const auto deferred = run(4096, true, &held_deferred, &peak_deferred);
  const auto reference = run(0, false, nullptr, nullptr);  // unfused: logits, then autograd
  EXPECT_EQ(held_plain, head_bytes);
  EXPECT_EQ(held_deferred, 0);
  EXPECT_LE(peak_deferred, peak_plain - head_bytes * 9 / 10);
  ASSERT_EQ(deferred.size(), reference.size());
  for (size_t i = 0; i < deferred.size(); ++i) {
    const double size = reference[i].norm().item<double>();
    EXPECT_LE((deferred[i] - reference[i]).norm().item<double>(), 1e-12 * size) << i;
    EXPECT_LE((plain[i] - reference[i]).norm().item<double>(), 1e-12 * size) << i;
  }
}
