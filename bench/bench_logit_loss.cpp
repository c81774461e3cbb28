// bench/bench_logit_loss.cpp: the fused logit loss alone (distill/logit_losses.h,
// logit_distillation_from_heads, gradient in forward: both heads' logits, forward KL + the LM
// cross-entropy, the student head's input and weight gradients formed in forward) on the shapes of
// bench_distill: 1024 tokens, hidden 512, vocab 32000, per chunk size: seconds per call
// (best of the rounds), the matrix products' share at the measured GEMM peak, and the extra
// peak tensor memory of the call. Chooses distill.chunk_tokens: the smallest chunk whose call
// is within noise of the fastest keeps the loss's memory low.
// Usage: bench_logit_loss [rounds=5] [threads=cores] [temperature=1]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "bench_args.h"
#include "bench_setup.h"
#include "common/compute_threads.h"
#include "distill/logit_losses.h"
#include "engine/observe/gemm_peak.h"
#include "engine/observe/memory_tracker.h"

using namespace retort;

int measure(int argc, char** argv) {
  const int rounds = int(bench::count_argument(argc, argv, 1, "rounds", 5));
  const int threads =
      int(bench::count_argument(argc, argv, 2, "threads", std::thread::hardware_concurrency()));
  const double temperature = argc > 3 ? std::atof(argv[3]) : 1.0;
  set_compute_threads(threads);
  engine::MemoryTracker& memory = engine::MemoryTracker::install();
  const int64_t tokens = 1024, hidden = 512, vocab = 32000;
  torch::manual_seed(0);
  torch::Tensor xs = torch::randn({tokens, hidden}).requires_grad_(true);
  torch::Tensor ws = (torch::randn({vocab, hidden}) * 0.05).requires_grad_(true);
  torch::Tensor xt = torch::randn({tokens, hidden});
  torch::Tensor wt = torch::randn({vocab, hidden}) * 0.05;
  torch::Tensor targets = torch::randint(vocab, {tokens});
  torch::Tensor weight = torch::ones({tokens});
  // Four products of [tokens, hidden] by [hidden, vocab]: both heads' logits, d/dx, d/dW.
  const double gemm_seconds =
      4 * 2.0 * tokens * hidden * vocab / 1e9 / engine::measure_gemm_gflops(1024, 5);
  std::printf("logit loss: %lld tokens, hidden %lld, vocab %lld, T %.2f, %d thread(s)\n",
              (long long)tokens, (long long)hidden, (long long)vocab, temperature, threads);
  std::printf("the four matrix products take %.3f s at the measured GEMM peak\n", gemm_seconds);
  std::printf("| chunk tokens | s per call | products at peak / call | extra peak MB |\n");
  std::printf("|--------------|------------|--------------------------|---------------|\n");
  for (int64_t chunk : {64, 96, 128, 192, 256}) {
    distill::LogitLossOptions options;
    options.chunk_tokens = chunk;
    options.temperature = temperature;
    double best = 1e30;
    int64_t extra = 0;
    for (int r = 0; r < rounds; ++r) {
      xs.mutable_grad() = torch::Tensor();
      ws.mutable_grad() = torch::Tensor();
      memory.reset_peak();
      const int64_t before = memory.current_bytes();
      const auto start = std::chrono::steady_clock::now();
      distill::LogitLossValue loss = distill::logit_distillation_from_heads(
          {xs, ws}, {xt, wt}, weight, targets, vocab, options, layers::TensorParallel{},
          {1.0 / tokens, 1.0 / tokens}, distill::HeadLogits::gradient_in_forward);
      loss.total.backward();
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      extra = std::max(extra, memory.peak_bytes() - before);
    }
    std::printf("| %12lld | %10.3f | %24.2f | %13.1f |\n", (long long)chunk, best,
                gemm_seconds / best, extra / 1e6);
  }
  return 0;
}

int main(int argc, char** argv) {
  return bench::main_reporting_errors(measure, argc, argv);
}
