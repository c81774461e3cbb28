// parallel/host_names.cpp: see host_names.h.
#include "parallel/host_names.h"

namespace retort::parallel {

std::vector<std::string> gather_host_names(MPI_Comm comm) {
  int size = 0, length = 0;
  MPI_Comm_size(comm, &size);
  constexpr int kWidth = MPI_MAX_PROCESSOR_NAME + 1;  // room for the terminating zero
  char name[kWidth] = {};
  MPI_Get_processor_name(name, &length);
  std::vector<char> names(size_t(size) * kWidth);
  MPI_Allgather(name, kWidth, MPI_CHAR, names.data(), kWidth, MPI_CHAR, comm);
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.emplace_back(names.data() + size_t(r) * kWidth);
  return hosts;
}

}  // namespace retort::parallel
