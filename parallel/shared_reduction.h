// parallel/shared_reduction.h: the sum over a group whose ranks all run on one node, done in
// shared memory instead of MPI messages. Each rank owns one MPI-3 shared window segment
// holding a region per slot (a slot is one recurring message: a DP gradient bucket). A rank
// copies its contribution into its region of the slot (start), then, once every rank's is
// there, sums its own 1/size chunk of the slot across all the regions and writes that sum
// into every region (progress); when all chunks are summed, each rank copies its region out
// (finish). Ranks read each other's memory directly: no kernel copy (MPI's CMA path), no
// copy-in and copy-out through message fragments, and each element is summed once on one
// rank, in rank order, so every rank gets bitwise the same result.
// Synchronisation is by per-slot generation counters in each segment's header (release
// stores, acquire loads). A rank writes a region only between its own start and the end of
// the peers' chunk sums, and reuses it only after finish, so no slot needs a reset.
// Waits go through the collective watchdog (runtime.collective_timeout_s).
// Across hosts the sum is hierarchical, as NCCL's and Megatron's are: when the group spans
// several hosts with the same number (two or more) of its ranks on each, the shared-memory
// sum runs within each host, and each rank all-reduces its summed chunk over MPI with the
// ranks of the same local number on the other hosts before writing it into its host's
// regions. Each host's link then carries one copy of every slot's bytes, split over its
// ranks, instead of one per rank. Each slot has its own cross-host communicator, so ranks
// may start slots in any order.
#pragma once
#include <mpi.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace retort::parallel {

class Communicator;

struct SharedSlot {
  int64_t elements = 0;
  torch::ScalarType dtype = torch::kFloat;  // float or double
};

class SharedReduction {
 public:
  // Collective over `group`. Null when the group has one rank, a host holds only one of its
  // ranks or hosts hold different numbers of them, a slot's dtype is neither float nor
  // double, or MPI cannot allocate the shared window. `host` says which ranks count as one
  // host (equal values; all ranks must in fact share memory): tests make several hosts on
  // one machine with it. Unset: the ranks that share memory (MPI_COMM_TYPE_SHARED).
  static std::unique_ptr<SharedReduction> create(Communicator& group,
                                                 const std::vector<SharedSlot>& slots,
                                                 std::optional<int> host = std::nullopt);
  ~SharedReduction();  // collective (frees the window)
  SharedReduction(const SharedReduction&) = delete;
  SharedReduction& operator=(const SharedReduction&) = delete;

  // Copies `inputs` (CPU, the slot's dtype, together the slot's elements) one after
  // another into this rank's region of the slot and announces them. The slot must not be in
  // flight on this rank (started and not finished).
  void start(int slot, const std::vector<torch::Tensor>& inputs);
  // Sums this rank's chunk of every slot in flight whose contributions have all arrived.
  // Never blocks.
  void progress();
  // Whether the slot's sum is complete on every chunk (finish would not wait).
  bool ready(int slot);
  // Waits (progressing other slots) for the slot's sum and copies it into `outputs`, laid
  // out as start's inputs.
  void finish(int slot, const std::vector<torch::Tensor>& outputs);
  // Waits for the slot's sum and leaves it in region(slot) only (no copy).
  void finish(int slot);
  // This rank's region of the slot as a 1-D tensor that does not own its memory: after
  // finish the sum, which stays until this rank starts the slot again (nobody else writes
  // it before that). Views of it must not outlive this object.
  torch::Tensor region(int slot) const;
  // Hosts the group spans (1: the sum is in shared memory alone).
  int hosts() const { return hosts_; }
  // How the sum runs, for logs: "shared memory (4 ranks)" or "shared memory within each of
  // 2 hosts (2 ranks each), then MPI across them".
  std::string describe() const;
  // Bytes of this rank's segment.
  int64_t segment_bytes() const { return segment_bytes_; }
  // Bytes start() has copied into this rank's regions so far (inputs already in place, formed
  // there by their producer, are not copied).
  int64_t bytes_copied_in() const { return bytes_copied_in_; }

 private:
  SharedReduction(Communicator& group, const std::vector<SharedSlot>& slots, MPI_Comm node,
                  int hosts);
  // The part of a slot whose sum this rank makes: [begin, begin + n) elements.
  std::pair<int64_t, int64_t> my_chunk(int slot) const;
  // Writes this rank's chunk, now the group's sum, into every region of its host and says so.
  void publish_my_chunk(int slot);
  uint64_t* counter(int rank, int kind, int slot) const;
  char* data(int rank, int slot) const;
  bool all_reached(int kind, int slot, uint64_t generation) const;
  void sum_my_chunk(int slot);

  Communicator& group_;
  std::vector<SharedSlot> slots_;
  std::vector<int64_t> offsets_;  // byte offset of each slot's data in a segment
  int64_t header_bytes_ = 0, segment_bytes_ = 0, bytes_copied_in_ = 0;
  MPI_Comm node_ = MPI_COMM_NULL;  // the group's ranks on this host, numbered as in the group
  int node_rank_ = 0, node_size_ = 1, hosts_ = 1;
  // Across hosts: per slot, the ranks of this local number on every host, and the
  // all-reduce of this rank's chunk in flight there (MPI_REQUEST_NULL when none).
  std::vector<MPI_Comm> across_;
  std::vector<MPI_Request> across_request_;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<char*> segments_;       // every host rank's segment, mapped here
  std::vector<uint64_t> generation_;  // per slot: the uses started on this rank
  std::vector<bool> in_flight_, summed_;
  std::string label_name_;
};

}  // namespace retort::parallel
