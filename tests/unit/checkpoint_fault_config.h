// tests/unit/checkpoint_fault_config.h: the run the checkpoint fault tests and their crash
// helper share: the tiny model on the shipped corpus, 6 steps, small enough to run in seconds.
#pragma once
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/config/train_config.h"

namespace retort::test {

inline engine::TrainConfig crash_test_config(const std::string& run_dir,
                                             std::vector<std::string> extra) {
  std::vector<std::string> all = {"data.paths=[" RETORT_TEST_CORPUS "]",
                                  "run.dir=" + run_dir,
                                  "runtime.peak_gflops=100",
                                  "model.layers=2",
                                  "model.hidden=32",
                                  "model.heads=2",
                                  "model.kv_heads=1",
                                  "model.ffn_hidden=64",
                                  "data.seq_len=16",
                                  "training.micro_batch=2",
                                  "training.global_batch=4",
                                  "training.eval_every=0",
                                  "training.steps=6",
                                  "checkpoint.save_at_end=false"};
  all.insert(all.end(), extra.begin(), extra.end());
  return engine::make_train_config(engine::Config::load(RETORT_TEST_CONFIGS "/tiny.yaml", all), 1);
}

}  // namespace retort::test
