// tests/mpi/world_group.h: a private duplicate of MPI_COMM_WORLD for a test's Communicator,
// so a test's messages never match another's.
#pragma once
#include <mpi.h>

inline MPI_Comm dup_world() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}
