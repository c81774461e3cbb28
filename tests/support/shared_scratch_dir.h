// tests/support/shared_scratch_dir.h: scratch_dir for MPI tests: world rank 0 makes the folder
// and sends its path to every rank (they all write into it), and rank 0 alone removes it when
// the process exits, after MPI_Finalize, so no rank is still using it.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "tests/support/scratch_dir.h"

namespace retort::testing {

// Collective over MPI_COMM_WORLD.
inline std::string shared_scratch_dir(const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string path = rank == 0 ? scratch_dir(name) : std::string();
  int length = int(path.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<char> bytes(path.begin(), path.end());
  bytes.resize(size_t(length));
  MPI_Bcast(bytes.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace retort::testing
