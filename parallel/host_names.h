// parallel/host_names.h: the host every rank of a communicator runs on (MPI's processor
// name), gathered once for banners and fault reports. No torch here.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace retort::parallel {

// Collective over comm: entry r is the processor name of comm's rank r.
std::vector<std::string> gather_host_names(MPI_Comm comm);

}  // namespace retort::parallel
