// bench/bench_scaling.cpp: tokens/s of full training steps of the bench_throughput model on
// however many ranks mpirun starts, one compute thread per rank, in the layout the key=value
// assignments choose (parallel.data, parallel.tensor, parallel.sequence_parallel, ...), and
// the exposed communication per step: the time ranks spent blocked in communication (waits
// of collectives and point-to-point, broadcasts, barriers; the slowest rank's figure), and
// each rank's compute per step (its step time less its own waits): ranks that do the same
// work but compute at different speeds show the cores were unequal during the run, which a
// data-parallel step pays for in waits. Rank 0 prints one table and one `json: {...}` line;
// bench/run_scaling.py runs it for one rank, DP2 and TP2 and prints the speed-ups.
// Usage: mpirun -np N bench_scaling [steps=3] [key=value ...]
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include "bench_args.h"
#include "bench_mpi_main.h"
#include "bench_setup.h"
#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "parallel/communicator.h"
#include "parallel/mesh.h"
#include "parallel/mpi_runtime.h"

using namespace retort;

namespace {

double max_over_ranks(double value) {
  double result = 0;
  MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return result;
}

int run(int argc, char** argv, parallel::MpiRuntime& mpi) {
  const int steps = int(bench::count_argument(argc, argv, 1, "steps", 3));
  const bool root = mpi.world_rank() == 0;
  set_compute_threads(1);
  // Every rank writes the same random dataset; each into its own directory.
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("retort_bench_scaling_" + std::to_string(mpi.world_rank())))
                              .string();
  std::vector<std::string> assignments = bench::measured_run_keys(dir, steps);
  for (const char* key : {"model.hidden=512", "model.layers=8", "model.heads=8", "model.kv_heads=8",
                          "model.ffn_hidden=1536"})
    assignments.push_back(key);
  for (int i = 2; i < argc; ++i) assignments.push_back(argv[i]);
  const engine::TrainConfig config =
      engine::make_train_config(engine::Config::load("", assignments), mpi.world_size());
  parallel::Mesh mesh(config.layout);
  engine::Trainer trainer(config, nullptr, mesh);
  trainer.train_step();  // warm-up
  MPI_Barrier(MPI_COMM_WORLD);
  parallel::reset_exposed_communication_seconds();
  engine::StepTimes total;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    const engine::StepResult r = trainer.train_step();
    total.forward_s += r.times.forward_s;
    total.backward_s += r.times.backward_s;
    total.sync_s += r.times.sync_s;
    total.optimizer_s += r.times.optimizer_s;
  }
  const double local_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double exposed = max_over_ranks(parallel::exposed_communication_seconds()) / steps;
  const double step_s = max_over_ranks(local_seconds) / steps;
  const double own_compute_s = (local_seconds - parallel::exposed_communication_seconds()) / steps;
  std::vector<double> compute_s(mpi.world_size());
  MPI_Gather(&own_compute_s, 1, MPI_DOUBLE, compute_s.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const auto [fastest, slowest] = std::minmax_element(compute_s.begin(), compute_s.end());
  const int64_t tokens_per_step = config.training.global_batch * config.data.seq_len;
  const double tokens_per_s = double(tokens_per_step) / step_s;
  if (!root) return 0;
  std::printf(
      "layout: %d rank(s), data %lld, tensor %lld%s, pipeline %lld; 1 thread per rank; "
      "global batch %lld x seq %lld\n",
      mpi.world_size(), (long long)config.layout.data, (long long)config.layout.tensor,
      config.layout.sequence_parallel ? " (sequence parallel)" : "",
      (long long)config.layout.pipeline, (long long)config.training.global_batch,
      (long long)config.data.seq_len);
  std::printf("| metric                          | value        |\n");
  std::printf("|---------------------------------|--------------|\n");
  std::printf("| step time (s)                   | %12.3f |\n", step_s);
  std::printf("|   forward, rank 0 (s)           | %12.3f |\n", total.forward_s / steps);
  std::printf("|   backward, rank 0 (s)          | %12.3f |\n", total.backward_s / steps);
  std::printf("|   gradient sync, rank 0 (s)     | %12.3f |\n", total.sync_s / steps);
  std::printf("|   clip + AdamW, rank 0 (s)      | %12.3f |\n", total.optimizer_s / steps);
  std::printf("| exposed communication (s)       | %12.3f |\n", exposed);
  std::printf("| compute, slowest rank (s)       | %12.3f |\n", *slowest);
  std::printf("| compute, fastest rank (s)       | %12.3f |\n", *fastest);
  std::printf("| tokens/s                        | %12.0f |\n", tokens_per_s);
  std::printf(
      "json: {\"tokens_per_s\": %.3f, \"step_s\": %.6f, \"exposed_comm_s\": %.6f, "
      "\"compute_slowest_s\": %.6f, \"compute_fastest_s\": %.6f, \"ranks\": %d, \"data\": %lld, "
      "\"tensor\": %lld}\n",
      tokens_per_s, step_s, exposed, *slowest, *fastest, mpi.world_size(),
      (long long)config.layout.data, (long long)config.layout.tensor);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::mpi_main_reporting_errors(run, argc, argv);
}
