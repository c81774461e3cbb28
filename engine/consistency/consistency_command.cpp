// engine/consistency/consistency_command.cpp: see consistency_command.h.
#include "engine/consistency/consistency_command.h"

#include <boost/algorithm/string.hpp>
#include <boost/program_options.hpp>
#include <iostream>

#include "common/user_error.h"
#include "engine/config/command_line.h"
#include "engine/consistency/consistency.h"

namespace po = boost::program_options;

namespace retort::engine {

int run_consistency_command(int argc, char** argv, parallel::MpiRuntime& mpi,
                            const std::function<void(size_t)>& before_layout) {
  po::options_description options("Usage: engine_consistency CONFIG.yaml [key=value ...]");
  std::string layouts_text, out;
  int64_t accumulation = 2, reference_accumulation = 1;
  bool exact = false;
  double tolerance = 0;
  std::vector<std::string> reference_keys;
  options.add_options()("help,h", "print this help")(
      "layouts",
      po::value<std::string>(&layouts_text)
          ->default_value("TP1,TP2,STP2,DP2,TP2xDP2,STP2xDP2,TP4,STP4,DP2-Z1,STP2xDP2-Z1,DP4-Z1"),
      "comma-separated layouts; the first is the reference")(
      "out", po::value<std::string>(&out)->default_value("runs/consistency"),
      "directory for the per-layout HDF5 records")(
      "accumulation", po::value<int64_t>(&accumulation)->default_value(2),
      "micro-batches per step on every layout but the reference")(
      "reference-accumulation", po::value<int64_t>(&reference_accumulation)->default_value(1),
      "micro-batches per step on the reference (the first layout)")(
      "exact", po::bool_switch(&exact),
      "hold every layout bitwise to the reference (layouts that run the same operations)")(
      "tolerance", po::value<double>(&tolerance)->default_value(0),
      "hold the loss, terms, gradient norm, gradients and activations to this relative "
      "tolerance instead of model.dtype's (0: model.dtype's)")(
      "reference-key", po::value<std::vector<std::string>>(&reference_keys)->composing(),
      "key=value for the reference (the first layout) alone, repeatable: the others are held "
      "to a differently configured run (a student from a teacher cache against one distilled "
      "online); its record is then <layout>_reference.h5");
  const ConfigCommandLine line = parse_config_command_line(argc, argv, options);
  const po::variables_map& vm = line.options;
  if (vm.count("help") || line.config.empty()) {
    if (mpi.world_rank() == 0)
      std::cout << options
                << "Tolerances follow model.dtype: float32 1e-5 (loss, terms, |g|) and 1e-4 "
                   "(gradients, activations); float64 1e-10 and 1e-9; bfloat16 derived from its "
                   "unit round-off, the layers and the tokens per step, and its gradients in "
                   "units of the reference's own bf16 error (the reference runs once more in "
                   "float64; printed with the table).\n";
    return vm.count("help") ? 0 : 2;
  }
  if (tolerance < 0 || (tolerance > 0 && exact))
    throw UserError(
        "--tolerance " + std::to_string(tolerance) +
        ": a relative tolerance is 0 (model.dtype's) or positive, and not with --exact");
  using Flag = std::pair<const char*, int64_t>;
  for (const auto& [flag, value] : {Flag{"--accumulation", accumulation},
                                    Flag{"--reference-accumulation", reference_accumulation}})
    if (value < 1)
      throw UserError(std::string(flag) + " " + std::to_string(value) +
                      ": a step takes at least one micro-batch");
  Config config = Config::load(line.config, line.overrides);
  config.apply_override("run.dir=" + out + "/runs");  // the layouts' metrics beside the records
  auto accumulation_of = [&](size_t i) { return i == 0 ? reference_accumulation : accumulation; };
  Config reference_config = config;
  for (const std::string& key_value : reference_keys) reference_config.apply_override(key_value);
  auto config_of = [&](size_t i) -> const Config& { return i == 0 ? reference_config : config; };
  std::vector<std::string> names;
  boost::split(names, layouts_text, boost::is_any_of(","));
  std::vector<ConsistencyLayout> layouts;
  for (const auto& n : names) {
    layouts.push_back(parse_consistency_layout(n));
    if (layouts.back().ranks() > mpi.world_size())
      throw UserError("layout " + n + " needs " + std::to_string(layouts.back().ranks()) +
                      " ranks but mpirun started " + std::to_string(mpi.world_size()));
  }
  auto record_name = [&](size_t i) {
    return layouts[i].file_name() + (i == 0 && !reference_keys.empty() ? "_reference" : "");
  };
  // Every layout is checked before any runs: a bad last one fails in a second, not after
  // the others have run.
  for (size_t i = 0; i < layouts.size(); ++i)
    consistency_train_config(config_of(i), layouts[i], accumulation_of(i));
  std::vector<LayoutRecord> records(layouts.size());
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (before_layout) before_layout(i);
    run_consistency_layout(config_of(i), layouts[i], accumulation_of(i), MPI_COMM_WORLD,
                           &records[i]);
    if (mpi.world_rank() == 0) {
      write_record(out + "/" + record_name(i) + ".h5", records[i]);
      std::cout << "ran " << layouts[i].name << " (" << records[i].transport << "): losses";
      for (const StepRecord& s : records[i].steps) std::printf(" %.10g", s.loss);
      if (!records[i].dp_sum.empty()) std::cout << "; dp sum: " << records[i].dp_sum;
      std::cout << std::endl;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // bf16 gradients are measured in units of the reference's own rounding error: the reference
  // layout again in float64.
  const bool against_float64 = !exact && config.get_string("model.dtype") == "bfloat16";
  LayoutRecord float64_reference;
  if (against_float64) {
    if (before_layout) before_layout(0);  // what the reference ran with
    Config exact_config = reference_config;
    exact_config.apply_override("model.dtype=float64");
    exact_config.apply_override("parallel.dp_reduce_dtype=float32");  // bf16 sums are for bf16
    exact_config.apply_override("run.dir=" + out + "/runs_float64");
    run_consistency_layout(exact_config, layouts[0], reference_accumulation, MPI_COMM_WORLD,
                           &float64_reference);
    if (mpi.world_rank() == 0) {
      write_record(out + "/" + layouts[0].file_name() + "_float64.h5", float64_reference);
      std::cout << "ran " << layouts[0].name << " in float64: losses";
      for (const StepRecord& s : float64_reference.steps) std::printf(" %.10g", s.loss);
      std::cout << std::endl;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  int failed = 0;
  if (mpi.world_rank() == 0) {
    const TrainConfig reference =
        consistency_train_config(reference_config, layouts[0], reference_accumulation);
    const std::string dtype = config.get_string("model.dtype");
    const int64_t tokens = reference.training.global_batch * reference.data.seq_len;
    const ConsistencyTolerances tol =
        exact             ? ConsistencyTolerances{0, 0, 0}
        : tolerance > 0   ? ConsistencyTolerances{tolerance, tolerance, tolerance}
        : against_float64 ? tolerances_against_float64(dtype, reference.model.layers, tokens)
                          : tolerances_for(dtype, reference.model.layers, tokens);
    std::vector<ComparisonRow> rows = {check_reference(layouts[0].name, records[0])};
    for (size_t i = 1; i < layouts.size(); ++i)
      rows.push_back(compare_records(layouts[i].name, records[0], records[i], tol,
                                     exact ? kExactGradientNorm : tol.loss, &float64_reference));
    for (const ComparisonRow& row : rows) failed |= !row.ok();
    for (const std::string& key_value : reference_keys)
      std::cout << "reference key: " << key_value << "\n";
    std::cout << "reference: " << layouts[0].name << " (" << config.get_string("model.dtype")
              << ", " << reference_accumulation << " micro-batch(es) a step; the others "
              << accumulation << ")" << (exact ? ", every layout held bitwise (|g| to 1e-6)" : "")
              << "\n"
              << format_comparison_table(rows, tol) << std::flush;
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return failed ? 1 : 0;
}

}  // namespace retort::engine
