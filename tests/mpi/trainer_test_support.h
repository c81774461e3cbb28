// tests/mpi/trainer_test_support.h: what the multi-rank trainer tests share: world rank and
// size, a small model's training config, and a check that a checkpoint file holds, for every
// parameter of a trainer's shard, the global tensor its ranks gather (a tied copy must equal what
// its owner wrote).
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <string>

#include "engine/checkpoint/checkpoint.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "layers/sharding.h"

namespace retort::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// configs/tiny.yaml shrunk to a model of hidden 64, 2 layers, sequence 32, 8 samples a step in
// micro-batches of 2, no evaluation or final checkpoint; `overrides` come after, so win. For
// `ranks` ranks (0: this world's).
inline engine::TrainConfig small_trainer_config(const std::vector<std::string>& overrides,
                                                int ranks = 0) {
  std::vector<std::string> all = {"data.paths=[" RETORT_TEST_CORPUS "]",
                                  "model.layers=2",
                                  "model.hidden=64",
                                  "model.heads=8",
                                  "model.kv_heads=2",
                                  "model.ffn_hidden=128",
                                  "data.seq_len=32",
                                  "training.global_batch=8",
                                  "training.micro_batch=2",
                                  "training.eval_every=0",
                                  "checkpoint.save_at_end=false",
                                  "runtime.peak_gflops=1",
                                  "runtime.threads=1"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return engine::make_train_config(engine::Config::load(RETORT_TEST_CONFIGS "/tiny.yaml", all),
                                   ranks > 0 ? ranks : world_size());
}

// Collective over the trainer's TP group (the gathers).
inline void expect_checkpoint_holds_parameters(const std::string& path, engine::Trainer& trainer) {
  const engine::CheckpointReader reader(path);
  for (auto& p : trainer.parameters().all()) {
    torch::Tensor global = layers::to_global(p.value, p.spec, trainer.tensor_parallel());
    torch::Tensor stored = reader.parameter(p.spec.name);
    EXPECT_TRUE(torch::equal(global, stored)) << p.spec.name;
  }
}

}  // namespace retort::test
