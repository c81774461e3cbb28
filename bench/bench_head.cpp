// bench/bench_head.cpp: the fused LM head and cross-entropy (layers/vocab_parallel.h) on one
// rank, forward and backward, with its element-wise steps as Retort's row loops
// (kernels/row_loops.h: one pass per row for the softmax, the loss and its gradient) and as
// the torch ops it runs under TP (max, exp, sum, gather, scatter over the chunk), alternated
// in every round, median and best of the rounds. The shapes are the issue-12 model's head:
// 1024 tokens, hidden 512, vocabulary 32000, chunks of 256 tokens.
// Usage: bench_head [threads=cores] [rounds=8] [tokens=1024]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "layers/vocab_parallel.h"

using namespace retort;

int main(int argc, char** argv) {
  setup_process(argv);
  const int threads =
      int(bench::count_argument(argc, argv, 1, "threads", std::thread::hardware_concurrency()));
  const int rounds = int(bench::count_argument(argc, argv, 2, "rounds", 8));
  const int64_t tokens = bench::count_argument(argc, argv, 3, "tokens", 1024);
  const int64_t hidden = 512, vocab = 32000, chunk = 256;
  set_compute_threads(threads);
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({tokens, hidden}).requires_grad_();
  const torch::Tensor w = (torch::randn({vocab, hidden}) * 0.02).requires_grad_();
  const torch::Tensor targets = torch::randint(vocab, {tokens});
  const layers::TensorParallel one_rank;
  layers::KernelPolicy kernels;
  auto step = [&] {
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    layers::fused_head_cross_entropy_sum(x, w, targets, vocab, one_rank, chunk, nullptr, kernels)
        .backward();
  };
  // The two forms must agree before they are timed.
  std::vector<torch::Tensor> grads[2];
  for (int loops = 0; loops < 2; ++loops) {
    kernels.head_row_loops = loops == 1;
    step();
    grads[loops] = {x.grad().clone(), w.grad().clone()};
  }
  for (int i = 0; i < 2; ++i) {
    const double error =
        ((grads[0][i] - grads[1][i]).abs().max() / grads[0][i].abs().max()).item<double>();
    if (error > 1e-4) {
      std::printf("row loops and torch ops differ by %.2e (relative)\n", error);
      return 1;
    }
  }
  std::vector<double> ms[2];
  for (int round = 0; round < rounds; ++round)
    for (int loops = 0; loops < 2; ++loops) {
      kernels.head_row_loops = loops == 1;
      const auto start = std::chrono::steady_clock::now();
      step();
      ms[loops].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3);
    }
  std::printf(
      "fused LM head + cross-entropy, forward and backward: %lld tokens, hidden %lld, "
      "vocabulary %lld, chunks of %lld, %d thread(s), %d alternated rounds\n",
      static_cast<long long>(tokens), static_cast<long long>(hidden), static_cast<long long>(vocab),
      static_cast<long long>(chunk), threads, rounds);
  std::printf("| element-wise steps | median ms | best ms |\n|---|---|---|\n");
  const char* names[2] = {"torch ops (as under TP)", "row loops"};
  for (int loops = 1; loops >= 0; --loops) {
    std::sort(ms[loops].begin(), ms[loops].end());
    std::printf("| %s | %.1f | %.1f |\n", names[loops], ms[loops][ms[loops].size() / 2],
                ms[loops].front());
  }
  return 0;
}
