// bench/bench_throughput.cpp: training throughput of a ~40M-parameter Llama-style model
// (hidden 512, 8 layers, 8 heads, 4 kv heads, vocab 32000, tied embeddings, sequence 256,
// micro-batch 4): tokens/s and MFU of full training steps (forward, backward, clip, AdamW),
// printed next to the fp32 GEMM peak measured on the same machine with the same threads.
// Usage: bench_throughput [steps=5] [threads=cores]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "engine/adamw.h"
#include "engine/gemm_peak.h"
#include "engine/memory_tracker.h"
#include "layers/model.h"

using namespace retort;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int threads = argc > 2 ? std::atoi(argv[2]) : int(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);
  engine::MemoryTracker& memory = engine::MemoryTracker::install();

  layers::ModelConfig c;
  c.vocab_size = 32000;
  c.hidden = 512;
  c.layers = 8;
  c.heads = 8;
  c.kv_heads = 4;
  c.ffn_hidden = 1376;
  c.tied_embeddings = true;
  const int64_t batch = 4, seq = 256;

  layers::ParameterStore store(1, torch::kFloat);
  layers::LlamaModel model(c, store);
  engine::OptimizerConfig oc;
  engine::AdamW adam(store, oc);
  torch::Tensor tokens = torch::randint(c.vocab_size, {batch, seq + 1}, torch::kLong);
  torch::Tensor inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);

  using clock = std::chrono::steady_clock;
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  auto since = [](clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  };
  auto step = [&] {
    for (auto& p : store.all())
      if (p.value.grad().defined()) p.value.mutable_grad().reset();
    auto t0 = clock::now();
    torch::Tensor loss = model.loss_sum(inputs, targets) / double(batch * seq);
    forward_s += since(t0);
    auto t1 = clock::now();
    loss.backward();
    backward_s += since(t1);
    auto t2 = clock::now();
    engine::clip_grad_norm(store, 1.0);
    adam.begin_step();
    adam.step_all(1e-4);
    optimizer_s += since(t2);
  };
  step();  // warm-up
  memory.reset_peak();
  forward_s = backward_s = optimizer_s = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const double tokens_per_s = double(steps * batch * seq) / seconds;
  const double flops_per_token = c.training_flops_per_token(seq);
  const double achieved = tokens_per_s * flops_per_token / 1e9;
  const double peak_1024 = engine::measure_gemm_gflops(1024);
  const double peak_2048 = engine::measure_gemm_gflops(2048, 3);
  const double peak = std::max(peak_1024, peak_2048);

  std::printf("model: %lld parameters (hidden %lld, %lld layers, %lld heads, %lld kv heads, "
              "vocab %lld), batch %lld x seq %lld, %d thread(s)\n",
              (long long)c.parameter_count(), (long long)c.hidden, (long long)c.layers,
              (long long)c.heads, (long long)c.kv_heads, (long long)c.vocab_size,
              (long long)batch, (long long)seq, threads);
  std::printf("| metric                          | value        |\n");
  std::printf("|---------------------------------|--------------|\n");
  std::printf("| step time (s)                   | %12.3f |\n", seconds / steps);
  std::printf("|   forward (s)                   | %12.3f |\n", forward_s / steps);
  std::printf("|   backward (s)                  | %12.3f |\n", backward_s / steps);
  std::printf("|   clip + AdamW (s)              | %12.3f |\n", optimizer_s / steps);
  std::printf("| tokens/s                        | %12.0f |\n", tokens_per_s);
  std::printf("| training FLOPs per token (M)    | %12.1f |\n", flops_per_token / 1e6);
  std::printf("| achieved GFLOP/s                | %12.1f |\n", achieved);
  std::printf("| fp32 GEMM 1024^3 GFLOP/s        | %12.1f |\n", peak_1024);
  std::printf("| fp32 GEMM 2048^3 GFLOP/s        | %12.1f |\n", peak_2048);
  std::printf("| MFU (vs best GEMM)              | %11.1f%% |\n", 100.0 * achieved / peak);
  std::printf("| peak tensor memory in a step    | %9.1f MB |\n", memory.peak_bytes() / 1e6);
  return 0;
}
