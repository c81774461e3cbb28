// parallel/transport.h: how a group moves tensors (Transport), which transport each group of a
// mesh uses (parallel.gpu_transport) and which GPU each rank takes (runtime.gpus_per_node). The
// rules are plain functions of where every rank's tensors live, tested without MPI or a GPU;
// Mesh::choose_transports gathers those places over each group and applies them. No torch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace retort::parallel {

// How a group moves tensors. direct: CPU tensors over MPI, CUDA tensors over NCCL.
// host_staged: each message is copied into a host buffer (pinned for a CUDA tensor), moved
// and reduced over MPI there, and copied back when the operation completes: what ranks
// sharing one GPU use, NCCL refusing two ranks of a communicator on one device. It works on
// CPU tensors too (a copy more), which is how its logic is tested without a GPU.
enum class Transport { direct, host_staged };
const char* transport_name(Transport transport);

enum class TransportChoice { automatic, nccl, host_staged };

// Where one rank's tensors live: its host (any number equal on the ranks of one host and only
// there) and GPU (-1: the CPU).
struct RankPlace {
  uint64_t host = 0;
  int gpu = -1;
};

// The transport of a group whose ranks (in group order) sit at `places`:
// - automatic: direct (MPI for CPU tensors, NCCL for GPU ones) unless two ranks share a GPU,
//   where NCCL refuses to run: then host-staged MPI;
// - nccl: direct; a UserError naming the group and the ranks where two share a GPU;
// - host_staged: host-staged, whatever the places (on CPU tensors too).
Transport transport_for(TransportChoice choice, const std::vector<RankPlace>& places,
                        const std::string& group);

// The GPU a rank takes: its local rank (among the ranks of its host) modulo the GPUs per
// node, which is gpus_per_node, or every visible GPU when 0. A UserError when there are none,
// or when gpus_per_node names more GPUs than the process sees.
int gpu_for_local_rank(int local_rank, int visible_gpus, int gpus_per_node);

}  // namespace retort::parallel
