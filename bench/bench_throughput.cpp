// bench/bench_throughput.cpp: training throughput of a ~40M-parameter Llama-style model
// (hidden 512, 8 layers, 8 heads, 4 kv heads, vocab 32000, tied embeddings, sequence 256,
// micro-batch 4) through the real Trainer on random tokens: tokens/s and MFU of full training
// steps (data, forward, backward, gradient sync, clip, AdamW), the step's phases from its
// StepResult, printed next to the fp32 GEMM peak measured with the same threads and the step's
// matrix products timed alone (products_floor.h): the tokens/s no engine on this BLAS exceeds.
// With runtime.device=cuda: MFU against the device's dense peak (engine/observe/device_peak.h),
// and no CPU measurement.
// Usage: bench_throughput [steps=5] [threads=cores] [key=value ...]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "bench_args.h"
#include "bench_setup.h"
#include "common/compute_threads.h"
#include "engine/observe/device_peak.h"
#include "engine/observe/gemm_peak.h"
#include "engine/observe/memory_tracker.h"
#include "engine/observe/op_profile.h"
#include "engine/train/trainer.h"
#include "products_floor.h"

using namespace retort;

int measure(int argc, char** argv) {
  const int steps = int(bench::count_argument(argc, argv, 1, "steps", 5));
  const int threads =
      int(bench::count_argument(argc, argv, 2, "threads", std::thread::hardware_concurrency()));
  set_compute_threads(threads);
  engine::MemoryTracker& memory = engine::MemoryTracker::install();

  const std::string dir =
      (std::filesystem::temp_directory_path() / "retort_bench_throughput").string();
  std::vector<std::string> assignments = bench::measured_run_keys(dir, steps);
  for (const char* key : {"model.hidden=512", "model.layers=8", "model.heads=8", "model.kv_heads=4",
                          "model.ffn_hidden=1376"})
    assignments.push_back(key);
  for (int i = 3; i < argc; ++i) assignments.push_back(argv[i]);
  const engine::TrainConfig config = bench::bench_config(assignments);
  engine::Trainer trainer(config, nullptr);
  trainer.train_step();  // warm-up
  memory.reset_peak();
  engine::StepTimes total;
  double seconds = 0;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const engine::StepResult r = trainer.train_step();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total.forward_s += r.times.forward_s;
    total.backward_s += r.times.backward_s;
    total.sync_s += r.times.sync_s;
    total.optimizer_s += r.times.optimizer_s;
  }

  const layers::ModelConfig& c = config.model;
  const int64_t tokens_per_step = config.training.global_batch * config.data.seq_len;
  const double tokens_per_s = double(steps * tokens_per_step) / seconds;
  const double flops_per_token = c.training_flops_per_token(config.data.seq_len);
  const double achieved = tokens_per_s * flops_per_token / 1e9;
  const double step_peak_bytes = double(memory.peak_bytes());  // before the measurements below
  // On the CPU: the best fp32 GEMM and the step's products timed alone, at the model's shapes.
  // On a GPU: the device's dense peak for the run's dtype (engine/observe/device_peak.h);
  // nothing is sized on the host to the GPU's model.
  const bool on_gpu = config.runtime.device == engine::Device::cuda;
  double peak_1024 = 0, peak_2048 = 0, peak = 0;
  std::string peak_how = "best fp32 GEMM on the CPU";
  bench::ProductsFloor floor;
  if (on_gpu) {
    const engine::DevicePeak device_peak = engine::device_compute_peak(
        /*index=*/0, config.dtype == engine::DType::bfloat16);
    peak = device_peak.gflops;
    peak_how = device_peak.how;
  } else {
    peak_1024 = engine::measure_gemm_gflops(1024);
    peak_2048 = engine::measure_gemm_gflops(2048, 3);
    peak = std::max(peak_1024, peak_2048);
    floor =
        bench::measure_products_floor(c, config.training.micro_batch * config.data.seq_len,
                                      config.memory.head_chunk_tokens, config.accumulation_steps());
  }
  const double floor_tokens_per_s = on_gpu ? 0 : double(tokens_per_step) / floor.seconds;

  std::printf(
      "model: %lld parameters (hidden %lld, %lld layers, %lld heads, %lld kv heads, "
      "vocab %lld), batch %lld x seq %lld, %d thread(s)\n",
      (long long)c.parameter_count(), (long long)c.hidden, (long long)c.layers, (long long)c.heads,
      (long long)c.kv_heads, (long long)c.vocab_size, (long long)config.training.micro_batch,
      (long long)config.data.seq_len, threads);
  std::printf("| metric                          | value        |\n");
  std::printf("|---------------------------------|--------------|\n");
  std::printf("| step time (s)                   | %12.3f |\n", seconds / steps);
  std::printf("|   forward (s)                   | %12.3f |\n", total.forward_s / steps);
  std::printf("|   backward (s)                  | %12.3f |\n", total.backward_s / steps);
  std::printf("|   gradient sync (s)             | %12.3f |\n", total.sync_s / steps);
  std::printf("|   clip + AdamW (s)              | %12.3f |\n", total.optimizer_s / steps);
  std::printf("| tokens/s                        | %12.0f |\n", tokens_per_s);
  std::printf("| training FLOPs per token (M)    | %12.1f |\n", flops_per_token / 1e6);
  std::printf("| achieved GFLOP/s                | %12.1f |\n", achieved);
  if (!on_gpu) {
    std::printf("| fp32 GEMM 1024^3 GFLOP/s        | %12.1f |\n", peak_1024);
    std::printf("| fp32 GEMM 2048^3 GFLOP/s        | %12.1f |\n", peak_2048);
  }
  std::printf("| peak GFLOP/s                    | %12.1f |\n", peak);
  std::printf("| MFU                             | %11.1f%% |\n", 100.0 * achieved / peak);
  if (!on_gpu) {
    std::printf("| products alone, same shapes (s) | %12.3f |\n", floor.seconds);
    std::printf("|   their GFLOP/s                 | %12.1f |\n", floor.gflop / floor.seconds);
    std::printf("|   tokens/s ceiling              | %12.0f |\n", floor_tokens_per_s);
  }
  std::printf("peak: %s\n", peak_how.c_str());
  std::printf("| peak tensor memory in a step    | %9.1f MB |\n", step_peak_bytes / 1e6);
  // One more step under torch's profiler: where the step's time goes, by op family (the
  // profiler's own cost inflates small ops, so shares, not the step time, are the point).
  std::map<std::string, double> family_ms;
  double profiled_ms = 0;
  for (const engine::OpTime& op : engine::profile_ops([&] { trainer.train_step(); })) {
    family_ms[engine::op_family(op.name)] += op.self_ms;
    profiled_ms += op.self_ms;
  }
  std::vector<std::pair<double, std::string>> families;
  for (const auto& [name, ms] : family_ms) families.push_back({ms, name});
  std::sort(families.rbegin(), families.rend());
  std::printf("\none profiled step, self time by op family (%.0f ms profiled):\n", profiled_ms);
  std::printf("| op family                       | ms     | share  |\n");
  std::printf("|---------------------------------|--------|--------|\n");
  double shown = 0;
  for (size_t i = 0; i < families.size() && i < 12; ++i) {
    std::printf("| %-31s | %6.0f | %5.1f%% |\n", families[i].second.c_str(), families[i].first,
                100 * families[i].first / profiled_ms);
    shown += families[i].first;
  }
  std::printf("| %-31s | %6.0f | %5.1f%% |\n", "(the rest)", profiled_ms - shown,
              100 * (profiled_ms - shown) / profiled_ms);
  // One machine-readable line for drivers (bench/peer/run_peer.py).
  std::printf(
      "json: {\"tokens_per_s\": %.3f, \"step_s\": %.6f, \"forward_s\": %.6f, "
      "\"backward_s\": %.6f, \"sync_s\": %.6f, \"optimizer_s\": %.6f, "
      "\"flops_per_token\": %.1f, \"gemm_peak_gflops\": %.3f, \"mfu\": %.5f, "
      "\"products_floor_s\": %.6f, \"threads\": %d, \"peak_how\": \"%s\"}\n",
      tokens_per_s, seconds / steps, total.forward_s / steps, total.backward_s / steps,
      total.sync_s / steps, total.optimizer_s / steps, flops_per_token, peak, achieved / peak,
      floor.seconds, threads, peak_how.c_str());
  return 0;
}

int main(int argc, char** argv) {
  return bench::main_reporting_errors(measure, argc, argv);
}
