// tests/mpi/trainer_test_support.h: what the multi-rank trainer tests share: world rank and
// size, and a check that a checkpoint file holds, for every parameter of a trainer's shard,
// the global tensor its ranks gather (a tied copy must equal what its owner wrote).
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <string>

#include "engine/checkpoint/checkpoint.h"
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
