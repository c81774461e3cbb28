// tools/engine_consistency.cpp: the gradient-consistency suite as one command:
//   mpirun -np 4 engine_consistency CONFIG.yaml [key=value ...] [--layouts TP1,TP2,...]
//          [--out DIR] [--accumulation 2]
// Runs the same short training under each layout on a subset of the ranks, writes
// DIR/<layout>.h5 and prints the table of relative differences against the first layout.
// Exits 1 if any layout exceeds the tolerances, 2 on bad input.
#include <boost/algorithm/string.hpp>
#include <boost/program_options.hpp>
#include <iostream>

#include "common/user_error.h"
#include "engine/command_line.h"
#include "engine/consistency.h"
#include "parallel/mpi_runtime.h"

namespace po = boost::program_options;
using namespace retort;

namespace {

int run(int argc, char** argv, parallel::MpiRuntime& mpi) {
  po::options_description options("Usage: engine_consistency CONFIG.yaml [key=value ...]");
  std::string layouts_text, out;
  int64_t accumulation = 2, samples = 1;
  options.add_options()("help,h", "print this help")(
      "layouts",
      po::value<std::string>(&layouts_text)
          ->default_value("TP1,TP2,STP2,DP2,TP2xDP2,STP2xDP2,TP4,STP4,DP2-Z1,STP2xDP2-Z1,DP4-Z1"),
      "comma-separated layouts; the first is the reference")(
      "out", po::value<std::string>(&out)->default_value("runs/consistency"),
      "directory for the per-layout HDF5 records")(
      "accumulation", po::value<int64_t>(&accumulation)->default_value(2),
      "micro-batches per step on every layout")(
      "samples", po::value<int64_t>(&samples)->default_value(1),
      "samples of the first micro-batch whose activations are compared");
  const engine::ConfigCommandLine line = engine::parse_config_command_line(argc, argv, options);
  const po::variables_map& vm = line.options;
  if (vm.count("help") || line.config.empty()) {
    if (mpi.world_rank() == 0) std::cout << options;
    return vm.count("help") ? 0 : 2;
  }
  engine::Config config = engine::Config::load(line.config, line.overrides);
  std::vector<std::string> names;
  boost::split(names, layouts_text, boost::is_any_of(","));
  std::vector<engine::ConsistencyLayout> layouts;
  for (const auto& n : names) {
    layouts.push_back(engine::parse_consistency_layout(n));
    if (layouts.back().ranks() > mpi.world_size())
      throw UserError("layout " + n + " needs " + std::to_string(layouts.back().ranks()) +
                      " ranks but mpirun started " + std::to_string(mpi.world_size()));
  }
  std::vector<engine::LayoutRecord> records(layouts.size());
  for (size_t i = 0; i < layouts.size(); ++i) {
    engine::run_consistency_layout(config, layouts[i], accumulation, samples, MPI_COMM_WORLD,
                                   &records[i]);
    if (mpi.world_rank() == 0) {
      engine::write_record(out + "/" + layouts[i].file_name() + ".h5", records[i]);
      std::cout << "ran " << layouts[i].name << ": losses";
      for (double l : records[i].losses) std::printf(" %.8f", l);
      std::cout << std::endl;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  int failed = 0;
  if (mpi.world_rank() == 0) {
    engine::ConsistencyTolerances tol;
    std::vector<engine::ComparisonRow> rows;
    for (size_t i = 1; i < layouts.size(); ++i) {
      rows.push_back(engine::compare_records(layouts[i].name, records[0], records[i], tol));
      failed |= !rows.back().ok;
    }
    std::cout << "reference: " << layouts[0].name << "\n"
              << engine::format_comparison_table(rows, tol);
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  parallel::MpiRuntime mpi(&argc, &argv);
  try {
    return run(argc, argv, mpi);
  } catch (const UserError& e) {
    if (mpi.world_rank() == 0) std::cerr << "error: " << e.what() << std::endl;
    parallel::MpiRuntime::abort_all(2);
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << std::endl;
    parallel::MpiRuntime::abort_all(3);
  }
}
