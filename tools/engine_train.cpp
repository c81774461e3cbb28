// tools/engine_train.cpp: the training binary, `engine_train CONFIG.yaml [key=value ...]`,
// launched directly or under mpirun. A thin main: flags, config, threads, then the Trainer.
// Bad input ends with one line "error: ..." and exit code 2.
#include <mpi.h>
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "common/user_error.h"
#include "engine/config/command_line.h"
#include "engine/config/config.h"
#include "engine/config/config_schema.h"
#include "engine/config/train_config.h"
#include "engine/observe/build_info.h"
#include "engine/observe/console_log.h"
#include "engine/observe/memory_tracker.h"
#include "engine/observe/run_summary.h"
#include "engine/plan/plan.h"
#include "engine/train/stop_signal.h"
#include "engine/train/trainer.h"
#include "parallel/collective_watchdog.h"
#include "parallel/mesh.h"
#include "parallel/mpi_runtime.h"

namespace po = boost::program_options;
using namespace retort;

namespace {

// A number as a user would write it ("2", "inf", "1e-06").
std::string shortest(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// Thrown on every rank once all ranks agree a set-up phase failed; main exits cleanly.
struct AgreedFailure {};

// Runs a set-up phase that performs no collective communication, then lets all ranks agree
// on its outcome: if any rank failed with bad input, the lowest such rank prints its one-line
// error and every rank stops cleanly (no MPI_Abort banner, no rank left waiting).
template <typename Phase>
void run_agreed(Phase phase, int rank) {
  std::string error;
  try {
    phase();
  } catch (const UserError& e) {
    error = e.what();
  }
  int first_failed = error.empty() ? std::numeric_limits<int>::max() : rank;
  MPI_Allreduce(MPI_IN_PLACE, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first_failed == std::numeric_limits<int>::max()) return;
  if (rank == first_failed) std::cerr << "error: " << error << std::endl;
  throw AgreedFailure{};
}

int train(int argc, char** argv, const parallel::MpiRuntime& mpi) {
  po::options_description visible("Usage: engine_train CONFIG.yaml [key=value ...] [options]");
  visible.add_options()("help,h", "print this help and exit")(
      "version",
      "print Retort's commit, the libtorch version, whether CUDA and NCCL are "
      "compiled in, and the BLAS in use, then exit")(
      "dry-run",
      "print the resolved config, parameter count, FLOPs per token and a memory "
      "estimate per rank, then exit")(
      "plan",
      "print the planner's memory per rank by category, communication bytes per step by "
      "group, and predicted step time for the layout on --nodes x --gpus-per-node ranks of "
      "--device, then exit; refuses a layout that does not fit")(
      "search",
      "with --plan: try every layout of the ranks (TP, PP, DP, ZeRO-1, checkpointing) and "
      "print the fastest that fit")("nodes", po::value<int>()->default_value(1), "--plan: hosts")(
      "gpus-per-node", po::value<int>(), "--plan: ranks per host (default: the ranks started)")(
      "device", po::value<std::string>()->default_value("h100"), "--plan: h100, a100 or cpu")(
      "tflops", po::value<double>(), "--plan: override the device's dense TFLOP/s")(
      "efficiency", po::value<double>(), "--plan: override the fraction of it a step reaches")(
      "memory-gb", po::value<double>(), "--plan: override the device's memory")(
      "intra-gbps", po::value<double>(), "--plan: override GB/s per rank within a host")(
      "inter-gbps", po::value<double>(), "--plan: override GB/s per rank across hosts");
  const engine::ConfigCommandLine line = engine::parse_config_command_line(argc, argv, visible);
  const po::variables_map& vm = line.options;
  const bool root = mpi.world_rank() == 0;
  if (vm.count("help")) {
    if (root)
      std::cout << visible << "\nEvery config key can be overridden as dotted.key=value, e.g.\n"
                << "  engine_train configs/tiny.yaml training.steps=50 optimizer.lr=1e-3\n\nKeys:\n"
                << engine::keys_help();
    return 0;
  }
  if (vm.count("version")) {
    if (root) std::cout << engine::version_text();
    return 0;
  }
  if (line.config.empty())
    throw UserError("no config file given (usage: engine_train CONFIG.yaml)");
  // The planner's flags mean nothing to a training run: given without --plan, they would be
  // ignored while a whole run starts.
  if (!vm.count("plan"))
    for (const char* flag : {"search", "nodes", "gpus-per-node", "device", "tflops", "efficiency",
                             "memory-gb", "intra-gbps", "inter-gbps"})
      if (vm.count(flag) && !vm[flag].defaulted())
        throw UserError(std::string("--") + flag +
                        " is a --plan flag: add --plan to plan (without it engine_train trains)");
  if (vm.count("plan")) {
    if (!root) return 0;
    engine::ClusterShape cluster;
    cluster.nodes = vm["nodes"].as<int>();
    cluster.gpus_per_node =
        vm.count("gpus-per-node") ? vm["gpus-per-node"].as<int>() : mpi.world_size();
    if (cluster.nodes < 1 || cluster.gpus_per_node < 1)
      throw UserError("--nodes and --gpus-per-node must be at least 1");
    cluster.device = engine::device_kind(vm["device"].as<std::string>());
    for (auto [flag, field] : {std::pair{"tflops", &cluster.device.tflops},
                               {"efficiency", &cluster.device.efficiency},
                               {"memory-gb", &cluster.device.memory_gb},
                               {"intra-gbps", &cluster.device.intra_gbps},
                               {"inter-gbps", &cluster.device.inter_gbps}})
      if (vm.count(flag)) {
        *field = vm[flag].as<double>();
        if (!(*field > 0) || !std::isfinite(*field))
          throw UserError(std::string("--") + flag + " " + shortest(*field) +
                          ": must be a positive finite number");
      }
    if (cluster.device.efficiency > 1)
      throw UserError("--efficiency " + shortest(cluster.device.efficiency) +
                      ": a fraction of the device's peak, at most 1");
    const engine::Config config = engine::Config::load(line.config, line.overrides);
    if (vm.count("search")) {
      bool any_fits = false;
      std::cout << engine::plan_search_report(config, cluster, 6, &any_fits) << std::flush;
      if (!any_fits)
        throw UserError("--plan --search: no layout of " +
                        std::to_string(cluster.nodes * cluster.gpus_per_node) + " ranks fits in " +
                        std::to_string(int(cluster.device.memory_gb)) +
                        " GB per rank (the smallest are listed above)");
      return 0;
    }
    std::string does_not_fit;
    std::cout << engine::plan_report(
                     engine::make_train_config(config, cluster.nodes * cluster.gpus_per_node),
                     cluster, &does_not_fit)
              << std::flush;
    if (!does_not_fit.empty()) throw UserError(does_not_fit);
    return 0;
  }
  engine::Config config;
  engine::TrainConfig train_config;
  run_agreed(
      [&] {
        config = engine::Config::load(line.config, line.overrides);
        train_config = engine::make_train_config(config, mpi.world_size());
      },
      mpi.world_rank());

  const int threads =
      train_config.runtime.threads > 0 ? int(train_config.runtime.threads) : mpi.threads_per_rank();
  set_compute_threads(threads);
  if (vm.count("dry-run")) {
    if (root) std::cout << config.to_yaml() << "\n---\n" << engine::run_summary(train_config);
    return 0;
  }
  engine::MemoryTracker::install();
  if (root)
    std::cout << "retort: " << mpi.world_size() << " rank(s), " << threads
              << " intra-op thread(s) per rank (" << mpi.local_size() << " on host " << mpi.host()
              << "); " << process_summary() << "\n"
              << "retort: " << engine::build_summary() << "\n"
              << engine::run_summary(train_config) << std::flush;
  parallel::Mesh mesh(train_config.layout);
  std::unique_ptr<engine::Trainer> trainer;
  run_agreed(
      [&] {
        trainer =
            std::make_unique<engine::Trainer>(train_config, root ? &std::cout : nullptr, mesh);
      },
      mpi.world_rank());
  trainer->set_terminal(root && engine::stdout_is_terminal());
  engine::install_stop_signal_handlers();  // SIGTERM/SIGINT: finish the step, save, exit 0
  parallel::watch_stop_signal(engine::stop_signal_received);  // a stop names the awaited ranks
  trainer->run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setup_process(argv);  // before MPI: it may re-execute the program
  parallel::MpiRuntime mpi(&argc, &argv);
  try {
    return train(argc, argv, mpi);
  } catch (const AgreedFailure&) {
    return 2;
  } catch (const AgreedStop& e) {  // every rank stops here together
    if (mpi.world_rank() == 0) std::cerr << "error: " << e.what() << std::endl;
    return e.exit_code;
  } catch (const UserError& e) {
    parallel::MpiRuntime::exit_on_user_error(e.what());
  } catch (const c10::Error& e) {
    std::cerr << "internal error: " << e.what_without_backtrace() << std::endl;
    parallel::MpiRuntime::abort_all(3);
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << std::endl;
    parallel::MpiRuntime::abort_all(3);
  }
}
