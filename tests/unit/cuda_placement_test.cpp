// tests/unit/cuda_placement_test.cpp: runtime.device=cuda against the same run on the CPU, on a
// machine with a GPU (each test skips itself without one; tools/gpu_check.sh runs them as its
// "CUDA unit tests"): every parameter, gradient and AdamW moment lives on the GPU; three
// training steps give the CPU's losses and parameters within fp32 round-off (TF32 off); a
// checkpoint saved from the GPU reloads on the CPU to the same tensors; greedy generation on
// the GPU gives the CPU's tokens; offloaded activations come back unchanged, and offloading
// changes no loss; the memory account files GPU blocks by category.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "engine/checkpoint/checkpoint.h"
#include "engine/config/config.h"
#include "engine/generate/generator.h"
#include "engine/observe/memory_tracker.h"
#include "engine/train/trainer.h"
#include "layers/recompute.h"
#include "tests/support/scratch_dir.h"
#include "tests/unit/generation_test.h"

using namespace retort;
using namespace retort::engine;

namespace {

// The build's corpus and configs, or (on the GPU machine, where this build's paths do not
// exist) the ones tools/gpu_check.sh names in the environment.
std::string from_environment(const char* name, const char* built) {
  const char* given = std::getenv(name);
  return given && *given ? given : built;
}

TrainConfig tiny_on(const std::string& device, const std::string& run_dir,
                    std::vector<std::string> keys = {}) {
  const std::string corpus = from_environment("RETORT_TEST_CORPUS", RETORT_TEST_CORPUS);
  const std::string configs = from_environment("RETORT_TEST_CONFIGS", RETORT_TEST_CONFIGS);
  keys.insert(keys.end(),
              {"data.paths=[" + corpus + "]", "run.dir=" + run_dir, "runtime.peak_gflops=100",
               "training.steps=3", "training.eval_every=0", "runtime.device=" + device});
  return make_train_config(Config::load(configs + "/tiny.yaml", keys), 1);
}

// fp32 products stay fp32 on the GPU, so the comparison is of round-off alone.
void without_tf32() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

}  // namespace

TEST(CudaPlacement, TrainingOnTheGpuFollowsTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  without_tf32();
  // Plain, and the optimizer step inside backward with a tied head (its rows stepped in blocks
  // by the head stepper, whose bookkeeping is built on the host).
  for (const std::vector<std::string>& keys :
       {std::vector<std::string>{},
        std::vector<std::string>{"optimizer.in_backward=true", "optimizer.grad_clip=0",
                                 "model.tied_embeddings=true"}}) {
    const std::string what = keys.empty() ? "plain" : "in backward, tied";
    Trainer cpu(tiny_on("cpu", retort::testing::scratch_dir("cuda_cpu"), keys), nullptr);
    Trainer gpu(tiny_on("cuda", retort::testing::scratch_dir("cuda_gpu"), keys), nullptr);
    for (int step = 0; step < 3; ++step) {
      const double expected = cpu.train_step().loss, got = gpu.train_step().loss;
      EXPECT_NEAR(got, expected, 1e-5 * std::abs(expected)) << what << ", step " << step + 1;
    }
    const auto& on_cpu = cpu.parameters().all();
    const auto& on_gpu = gpu.parameters().all();
    ASSERT_EQ(on_cpu.size(), on_gpu.size());
    for (size_t i = 0; i < on_gpu.size(); ++i) {
      EXPECT_TRUE(on_gpu[i].value.is_cuda()) << on_gpu[i].spec.name;
      const auto& state = gpu.optimizer().states()[i];
      if (state.exp_avg.defined()) {
        EXPECT_TRUE(state.exp_avg.is_cuda()) << on_gpu[i].spec.name;
        EXPECT_TRUE(state.exp_avg_sq.is_cuda()) << on_gpu[i].spec.name;
      }
      EXPECT_TRUE(torch::allclose(on_gpu[i].value.cpu(), on_cpu[i].value, 1e-4, 1e-6))
          << what << ": " << on_gpu[i].spec.name;
    }
  }
}

TEST(CudaPlacement, CheckpointSavedFromTheGpuReloadsOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const std::string dir = retort::testing::scratch_dir("cuda_checkpoint");
  Trainer gpu(tiny_on("cuda", dir), nullptr);
  gpu.train_step();
  gpu.save(checkpoint_path(dir, gpu.step()));
  Trainer cpu(tiny_on("cpu", dir, {"checkpoint.load=" + dir}), nullptr);
  ASSERT_EQ(cpu.step(), 1);
  for (size_t i = 0; i < cpu.parameters().all().size(); ++i)
    EXPECT_TRUE(
        torch::equal(cpu.parameters().all()[i].value, gpu.parameters().all()[i].value.cpu()))
        << cpu.parameters().all()[i].spec.name;
}

TEST(CudaPlacement, GreedyGenerationOnTheGpuGivesTheCpuTokens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  without_tf32();
  // The same seed: the same initial values on either device.
  const test::GenerationModel on_cpu = test::generation_model({}, torch::kFloat, torch::kCPU);
  const test::GenerationModel on_gpu = test::generation_model({}, torch::kFloat, torch::kCUDA);
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 16;
  const std::vector<int64_t> prompt = {84, 104, 101, 32};
  EXPECT_EQ(generate(*on_gpu.model, prompt, greedy), generate(*on_cpu.model, prompt, greedy));
}

// Activation offloading of GPU tensors: through pinned host memory on a side stream, back in
// backward's order (each take prefetching its predecessor), with the values unchanged; and a
// run offloading its checkpointed blocks' inputs trains exactly as one that keeps them.
TEST(CudaPlacement, OffloadedActivationsComeBackUnchanged) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  layers::ActivationOffloader offloader;
  offloader.begin_chain();
  std::vector<torch::Tensor> originals;
  std::vector<int64_t> slots;
  for (int i = 0; i < 4; ++i) {
    torch::Tensor t = torch::randn({256, 64}, torch::kCUDA);
    originals.push_back(t.clone());
    slots.push_back(offloader.put({t * 1.0}));  // the offloaded tensor's memory is let go
  }
  for (int i = 3; i >= 0; --i) {
    const std::vector<torch::Tensor> back = offloader.take(slots[size_t(i)]);
    ASSERT_EQ(back.size(), 1u);
    EXPECT_TRUE(back[0].is_cuda());
    EXPECT_TRUE(torch::equal(back[0], originals[size_t(i)])) << "slot " << i;
  }
  EXPECT_EQ(offloader.moved_out(), 4);
  EXPECT_EQ(offloader.moved_back(), 4);
  EXPECT_EQ(offloader.prefetch_hits(), 3);
  EXPECT_EQ(offloader.pending(), 0u);
}

TEST(CudaPlacement, OffloadingOnTheGpuTrainsExactlyAsKeeping) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  Trainer keeping(tiny_on("cuda", retort::testing::scratch_dir("cuda_keep"),
                          {"memory.activation_checkpointing=full"}),
                  nullptr);
  Trainer offloading(
      tiny_on("cuda", retort::testing::scratch_dir("cuda_offload"),
              {"memory.activation_checkpointing=full", "memory.activation_offloading=true"}),
      nullptr);
  for (int step = 0; step < 3; ++step)
    EXPECT_EQ(offloading.train_step().loss, keeping.train_step().loss) << "step " << step + 1;
}

// The memory account on a GPU: the CUDA caching allocator's blocks are filed by category like
// CPU memory, so a GPU trainer's parameters category is its parameters' bytes and a step's
// activations show.
TEST(CudaPlacement, MemoryAccountFilesGpuBlocksByCategory) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  MemoryTracker& tracker = MemoryTracker::install();
  const int64_t before = tracker.current_split().of(MemoryCategory::parameters);
  Trainer gpu(tiny_on("cuda", retort::testing::scratch_dir("cuda_memory")), nullptr);
  int64_t parameter_bytes = 0;
  for (const auto& p : gpu.parameters().all())
    parameter_bytes += p.value.numel() * p.value.element_size();
  EXPECT_EQ(tracker.current_split().of(MemoryCategory::parameters) - before, parameter_bytes);
  tracker.reset_peak();
  gpu.train_step();
  EXPECT_GT(tracker.category_peaks().of(MemoryCategory::activations), 0);
  EXPECT_GT(tracker.current_split().of(MemoryCategory::optimizer_state), 0);
}
