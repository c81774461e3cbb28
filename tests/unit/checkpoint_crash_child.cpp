// tests/unit/checkpoint_crash_child.cpp: a test helper, not a tool. Trains the tiny model of
// the checkpoint fault tests with saves every 2 steps, and kills itself (SIGKILL) inside the
// save at the step and point its arguments name (common/fault_injection.h), as a pre-empted
// or crashed job would. Usage: checkpoint_crash_child RUN_DIR KILL_STEP POINT
// POINT: after_rank_files | before_rename | before_latest
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/fault_injection.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "tests/unit/checkpoint_fault_config.h"

using namespace retort;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: checkpoint_crash_child RUN_DIR KILL_STEP POINT\n";
    return 2;
  }
  const std::string point = argv[3];
  const Fault fault = point == "after_rank_files" ? Fault::KillAfterRankFiles
                      : point == "before_rename"  ? Fault::KillBeforeRename
                                                  : Fault::KillBeforeLatest;
  const int64_t kill_step = std::atoll(argv[2]);
  engine::Trainer trainer(test::crash_test_config(argv[1], {}), nullptr);
  while (trainer.step() < 6) {
    // The fault is armed only for the save of kill_step (saves happen inside train_step's
    // caller, run(): here, explicitly).
    trainer.train_step();
    if (trainer.step() % 2 == 0) {
      if (trainer.step() == kill_step) set_injected_fault(fault);
      trainer.save(engine::checkpoint_path(argv[1], trainer.step()));
    }
  }
  return 0;
}
