// bench/bench_pipeline.cpp: the pipeline bubble, measured on the real trainer. For 1, 4 and 8
// micro-batches per step it trains a few steps of the config's model under 1F1B and prints,
// per stage, the time spent running forwards and backwards (busy) and the rest of the
// schedule (idle: waiting on neighbours, i.e. bubble plus communication), next to the
// 1F1B bubble fraction (p-1)/(m+p-1) that idle time should approach. Run one rank per core:
// oversubscribed ranks are descheduled inside their callbacks and the busy times mean little.
//   mpirun -np 2 bench_pipeline configs/bench_pipeline.yaml [key=value ...]
// The layout is parallel.pipeline = world size (one rank per stage, no TP, no DP).
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>

#include "bench_mpi_main.h"
#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/config/command_line.h"
#include "engine/config/config.h"
#include "engine/config/train_config.h"
#include "engine/train/trainer.h"
#include "parallel/mesh.h"
#include "parallel/mpi_runtime.h"

using namespace retort;

namespace {

int run(int argc, char** argv, parallel::MpiRuntime& mpi) {
  boost::program_options::options_description options(
      "Usage: bench_pipeline CONFIG.yaml [key=value ...]");
  const engine::ConfigCommandLine line = engine::parse_config_command_line(argc, argv, options);
  if (line.config.empty()) throw UserError("no config file given");
  const int stages = mpi.world_size();
  const bool root = mpi.world_rank() == 0;
  set_compute_threads(1);
  if (root)
    std::printf(
        "| micro-batches | stage | busy ms/step | idle ms/step | idle fraction | "
        "(p-1)/(m+p-1) |\n|---|---|---|---|---|---|\n");
  for (int micro_batches : {1, 4, 8}) {
    engine::Config config = engine::Config::load(line.config, line.overrides);
    config.apply_override("parallel.pipeline=" + std::to_string(stages));
    config.apply_override("parallel.tensor=1");
    config.apply_override("parallel.data=1");
    config.apply_override("training.global_batch=" +
                          std::to_string(micro_batches * config.get_int("training.micro_batch")));
    config.apply_override("checkpoint.save_at_end=false");
    config.apply_override("training.eval_every=0");
    const engine::TrainConfig train_config = engine::make_train_config(config, stages);
    parallel::Mesh mesh(train_config.layout);
    engine::Trainer trainer(train_config, nullptr, mesh);
    engine::StepInspector inspector;  // bubble timing is opt-in: barriers frame the schedule
    inspector.time_pipeline = true;
    trainer.set_inspector(&inspector);
    const int64_t warmup = 1, measured = train_config.training.steps;
    double busy = 0, wall = 0;
    for (int64_t step = 0; step < warmup + measured; ++step) {
      trainer.train_step();
      if (step < warmup) continue;
      busy += inspector.pipeline_timing.busy_s;
      wall += inspector.pipeline_timing.wall_s;
    }
    double mine[2] = {busy / double(measured), wall / double(measured)};
    std::vector<double> all(2 * stages);
    MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (!root) continue;
    const double bubble = double(stages - 1) / double(micro_batches + stages - 1);
    double busy_sum = 0, wall_sum = 0;
    for (int s = 0; s < stages; ++s) {
      const double b = all[2 * s], w = all[2 * s + 1];
      busy_sum += b, wall_sum += w;
      std::printf("| %d | %d | %.1f | %.1f | %.3f | %.3f |\n", micro_batches, s, 1e3 * b,
                  1e3 * (w - b), (w - b) / w, bubble);
    }
    std::printf("| %d | mean | %.1f | %.1f | %.3f | %.3f |\n", micro_batches,
                1e3 * busy_sum / stages, 1e3 * (wall_sum - busy_sum) / stages,
                (wall_sum - busy_sum) / wall_sum, bubble);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::mpi_main_reporting_errors(run, argc, argv);
}
