// tests/mpi/tp_layouts.h: the three tensor-parallel layouts a loss test runs under, with the
// world as the TP group: TP1 (each rank alone), TP<world> and STP<world> (sequence parallel).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "layers/tensor_parallel.h"
#include "parallel/communicator.h"

namespace retort::test {

inline std::vector<std::pair<std::string, layers::TensorParallel>> tp_layouts(
    parallel::Communicator& world_tp) {
  const std::string n = std::to_string(world_tp.size());
  return {{"TP1", layers::TensorParallel{}},
          {"TP" + n, layers::TensorParallel{&world_tp, false}},
          {"STP" + n, layers::TensorParallel{&world_tp, true}}};
}

}  // namespace retort::test
