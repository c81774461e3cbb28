// tests/consistency/consistency_faults.cpp: the consistency suite with one deliberate fault
// (common/fault_injection.h) in every layout after the reference:
//   mpirun -np N consistency_faults FAULT CONFIG.yaml [key=value ...] [--layouts ...] ...
// The rest of the command line is engine_consistency's. A test binary only: the fault is
// never reachable from the engine's own programs. Exit codes are the suite's (1 = a layout
// failed, which is what a caught fault must give).
#include <cstring>
#include <iostream>
#include <map>

#include "common/fault_injection.h"
#include "common/user_error.h"
#include "engine/consistency/consistency_command.h"
#include "parallel/mpi_runtime.h"

using namespace retort;

int main(int argc, char** argv) {
  parallel::MpiRuntime mpi(&argc, &argv);
  const std::map<std::string, Fault> faults = {
      {"tp_norm_not_summed", Fault::TpNormGradNotSummed},
      {"dp_not_averaged", Fault::DpGradNotAveraged},
      {"tied_sum_skipped", Fault::TiedSumSkipped},
      {"grad_scaled", Fault::GradScaled},
      {"grad_missing", Fault::GradMissing},
      {"activation_local_tokens", Fault::ActivationLocalTokens},
      {"logit_one_tp_rank", Fault::LogitTermOneTpRank}};
  auto it = argc > 1 ? faults.find(argv[1]) : faults.end();
  if (it == faults.end()) {
    if (mpi.world_rank() == 0) {
      std::cerr << "usage: consistency_faults FAULT CONFIG.yaml [engine_consistency arguments]\n"
                << "faults:";
      for (const auto& [name, fault] : faults) std::cerr << " " << name;
      std::cerr << std::endl;
    }
    return 2;
  }
  const Fault fault = it->second;
  // Drop the fault from the command line; the rest is the suite's.
  for (int i = 1; i + 1 < argc; ++i) argv[i] = argv[i + 1];
  --argc;
  try {
    return engine::run_consistency_command(argc, argv, mpi, [fault](size_t layout) {
      set_injected_fault(layout == 0 ? Fault::None : fault);
    });
  } catch (const UserError& e) {
    parallel::MpiRuntime::exit_on_user_error(e.what());
  }
}
