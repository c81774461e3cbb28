// parallel/shared_reduction.cpp: see shared_reduction.h.
//
// Segment layout (every rank's the same): a header of 2 x slots generation counters, each on
// a cache line of its own (kind 0: "my contribution to this use of the slot is in my region",
// kind 1: "my chunk of it is summed into every region"), then each slot's data, 64-byte
// aligned. Rank r sums the elements [r * chunk, (r + 1) * chunk) of a slot, chunk a multiple
// of 16 elements.
#include "parallel/shared_reduction.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "parallel/collective_watchdog.h"
#include "parallel/communicator.h"

namespace retort::parallel {
namespace {

constexpr int64_t kLine = 64;
constexpr int kContributed = 0, kSummed = 1;

int64_t round_up(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

// parts[home][i] = sum over k (in rank order) of parts[k][i], for i in [0, n), also written
// into the other parts when `targets` is their count (1: into parts[home] alone).
template <typename T>
void sum_into(const std::vector<T*>& parts, int64_t n, size_t targets, int home) {
  constexpr int64_t kBlock = 2048;
  alignas(64) T acc[kBlock];
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t m = std::min(kBlock, n - begin);
    std::memcpy(acc, parts[0] + begin, m * sizeof(T));
    for (size_t k = 1; k < parts.size(); ++k) {
      const T* part = parts[k] + begin;
      for (int64_t i = 0; i < m; ++i) acc[i] += part[i];
    }
    if (targets == 1)
      std::memcpy(parts[size_t(home)] + begin, acc, m * sizeof(T));
    else
      for (T* part : parts) std::memcpy(part + begin, acc, m * sizeof(T));
  }
}

}  // namespace

std::unique_ptr<SharedReduction> SharedReduction::create(Communicator& group,
                                                         const std::vector<SharedSlot>& slots,
                                                         std::optional<int> host) {
  if (group.size() == 1 || group.mpi() == MPI_COMM_NULL) return nullptr;
  bool usable = true;
  for (const SharedSlot& s : slots)
    usable = usable && (s.dtype == torch::kFloat || s.dtype == torch::kDouble);
  MPI_Comm node = MPI_COMM_NULL;
  if (host)
    MPI_Comm_split(group.mpi(), *host, group.rank(), &node);
  else
    MPI_Comm_split_type(group.mpi(), MPI_COMM_TYPE_SHARED, group.rank(), MPI_INFO_NULL, &node);
  int node_size = 0, node_rank = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  // Every rank must agree: hosts of unequal shares, or of one rank, make the group fall back.
  int sizes[2] = {usable ? node_size : 0, -node_size};  // min, -max
  MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MIN, group.mpi());
  if (sizes[0] < 2 || sizes[0] != -sizes[1]) {
    MPI_Comm_free(&node);
    return nullptr;
  }
  return std::unique_ptr<SharedReduction>(
      new SharedReduction(group, slots, node, group.size() / node_size));
}

SharedReduction::SharedReduction(Communicator& group, const std::vector<SharedSlot>& slots,
                                 MPI_Comm node, int hosts)
    : group_(group),
      slots_(slots),
      node_(node),
      hosts_(hosts),
      generation_(slots.size(), 0),
      in_flight_(slots.size(), false),
      summed_(slots.size(), false),
      label_name_(group.name() + " (shared memory)") {
  MPI_Comm_rank(node_, &node_rank_);
  MPI_Comm_size(node_, &node_size_);
  if (hosts_ > 1) {
    // One communicator per slot: collectives on one communicator must be started in the same
    // order everywhere, and ranks start slots in the order their gradients become ready.
    across_.resize(slots.size(), MPI_COMM_NULL);
    across_request_.resize(slots.size(), MPI_REQUEST_NULL);
    for (MPI_Comm& across : across_) MPI_Comm_split(group.mpi(), node_rank_, group.rank(), &across);
    label_name_ = group.name() + " (shared memory, then MPI across hosts)";
  }
  header_bytes_ = round_up(int64_t(2 * slots.size()) * kLine, kLine);
  int64_t bytes = header_bytes_;
  for (const SharedSlot& s : slots) {
    offsets_.push_back(bytes);
    bytes += round_up(s.elements * int64_t(torch::elementSize(s.dtype)), kLine);
  }
  segment_bytes_ = bytes;
  // Each segment apart (not one contiguous block): each rank's pages are then first touched,
  // and so placed, by their own rank.
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  char* mine = nullptr;
  const int failed =
      MPI_Win_allocate_shared(MPI_Aint(segment_bytes_), 1, info, node_, &mine, &window_);
  MPI_Info_free(&info);
  if (failed != MPI_SUCCESS)
    throw std::runtime_error("shared-memory reduction on group '" + group.name() +
                             "': MPI_Win_allocate_shared of " + std::to_string(segment_bytes_) +
                             " bytes failed");
  std::memset(mine, 0, size_t(header_bytes_));
  // Ranks in node_ are ordered as in the group (the split's key was the group rank).
  segments_.resize(node_size_);
  for (int r = 0; r < node_size_; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    MPI_Win_shared_query(window_, r, &size, &unit, &segments_[r]);
  }
  MPI_Barrier(node_);  // every header zeroed before anyone looks at it
}

SharedReduction::~SharedReduction() {
  for (MPI_Request& request : across_request_)
    if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
  for (MPI_Comm& across : across_) MPI_Comm_free(&across);
  MPI_Win_free(&window_);
  MPI_Comm_free(&node_);
}

uint64_t* SharedReduction::counter(int rank, int kind, int slot) const {
  return reinterpret_cast<uint64_t*>(segments_[rank] + (2 * slot + kind) * kLine);
}

char* SharedReduction::data(int rank, int slot) const {
  return segments_[rank] + offsets_[slot];
}

torch::Tensor SharedReduction::region(int slot) const {
  return torch::from_blob(data(node_rank_, slot), {slots_[slot].elements},
                          torch::TensorOptions().dtype(slots_[slot].dtype));
}

bool SharedReduction::all_reached(int kind, int slot, uint64_t generation) const {
  for (int r = 0; r < node_size_; ++r)
    if (__atomic_load_n(counter(r, kind, slot), __ATOMIC_ACQUIRE) < generation) return false;
  return true;
}

void SharedReduction::start(int slot, const std::vector<torch::Tensor>& inputs) {
  if (in_flight_[slot])
    throw std::logic_error("SharedReduction::start: slot " + std::to_string(slot) +
                           " is still in flight");
  const SharedSlot& s = slots_[slot];
  torch::Tensor mine = region(slot);
  int64_t filled = 0;
  for (const torch::Tensor& t : inputs) {
    if (t.scalar_type() != s.dtype || t.device().type() != torch::kCPU ||
        filled + t.numel() > s.elements)
      throw std::invalid_argument("SharedReduction::start: slot " + std::to_string(slot) +
                                  " takes CPU tensors of its dtype, " + std::to_string(s.elements) +
                                  " elements in all");
    torch::Tensor place = mine.narrow(0, filled, t.numel()).view(t.sizes());
    if (t.data_ptr() != place.data_ptr() || !t.is_contiguous()) {  // else already in place
      place.copy_(t);
      bytes_copied_in_ += t.numel() * int64_t(t.element_size());
    }
    filled += t.numel();
  }
  if (filled != s.elements)
    throw std::invalid_argument("SharedReduction::start: slot " + std::to_string(slot) + " has " +
                                std::to_string(s.elements) + " elements, the inputs " +
                                std::to_string(filled));
  group_.count("all_reduce", s.elements * int64_t(torch::elementSize(s.dtype)));
  ++generation_[slot];
  in_flight_[slot] = true;
  summed_[slot] = false;
  __atomic_store_n(counter(node_rank_, kContributed, slot), generation_[slot], __ATOMIC_RELEASE);
  progress();
}

std::pair<int64_t, int64_t> SharedReduction::my_chunk(int slot) const {
  const int64_t elements = slots_[slot].elements;
  const int64_t chunk = round_up((elements + node_size_ - 1) / node_size_, 16);
  const int64_t begin = std::min(elements, node_rank_ * chunk);
  return {begin, std::min(elements - begin, chunk)};
}

void SharedReduction::sum_my_chunk(int slot) {
  const SharedSlot& s = slots_[slot];
  const auto [begin, n] = my_chunk(slot);
  // Within one host the sum goes into every region at once; across hosts only into this
  // rank's, until the other hosts' sums are added.
  const bool everywhere = hosts_ == 1;
  auto sum = [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    std::vector<T*> parts;
    for (int r = 0; r < node_size_; ++r)
      parts.push_back(reinterpret_cast<T*>(data(r, slot)) + begin);
    sum_into(parts, n, everywhere ? parts.size() : 1, node_rank_);
  };
  if (s.dtype == torch::kFloat)
    sum(static_cast<float*>(nullptr));
  else
    sum(static_cast<double*>(nullptr));
  summed_[slot] = true;
  if (everywhere) {
    __atomic_store_n(counter(node_rank_, kSummed, slot), generation_[slot], __ATOMIC_RELEASE);
    return;
  }
  MPI_Iallreduce(MPI_IN_PLACE,
                 data(node_rank_, slot) + begin * int64_t(torch::elementSize(s.dtype)), int(n),
                 s.dtype == torch::kFloat ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, across_[slot],
                 &across_request_[slot]);
}

void SharedReduction::publish_my_chunk(int slot) {
  const auto [begin, n] = my_chunk(slot);
  const int64_t element = int64_t(torch::elementSize(slots_[slot].dtype));
  const char* mine = data(node_rank_, slot) + begin * element;
  for (int r = 0; r < node_size_; ++r)
    if (r != node_rank_) std::memcpy(data(r, slot) + begin * element, mine, size_t(n * element));
  __atomic_store_n(counter(node_rank_, kSummed, slot), generation_[slot], __ATOMIC_RELEASE);
}

void SharedReduction::progress() {
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    if (!in_flight_[slot]) continue;
    if (!summed_[slot] && all_reached(kContributed, int(slot), generation_[slot]))
      sum_my_chunk(int(slot));
    if (!across_.empty() && across_request_[slot] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&across_request_[slot], &done, MPI_STATUS_IGNORE);
      if (done) publish_my_chunk(int(slot));  // MPI_Test has reset the request to null
    }
  }
}

std::string SharedReduction::describe() const {
  if (hosts_ == 1) return "shared memory (" + std::to_string(node_size_) + " ranks)";
  return "shared memory within each of " + std::to_string(hosts_) + " hosts (" +
         std::to_string(node_size_) + " ranks each), then MPI across them";
}

bool SharedReduction::ready(int slot) {
  progress();
  return in_flight_[slot] && all_reached(kSummed, slot, generation_[slot]);
}

void SharedReduction::finish(int slot) {
  if (!in_flight_[slot])
    throw std::logic_error("SharedReduction::finish: slot " + std::to_string(slot) +
                           " was not started");
  if (!ready(slot)) {
    ExposedWait exposed;
    wait_or_abort([&] { return ready(slot); }, WaitLabel{"all_reduce", &label_name_, group_.mpi()});
  }
  in_flight_[slot] = false;
}

void SharedReduction::finish(int slot, const std::vector<torch::Tensor>& outputs) {
  finish(slot);
  torch::Tensor sum = region(slot);
  int64_t taken = 0;
  for (const torch::Tensor& t : outputs) {
    if (t.scalar_type() != slots_[slot].dtype || taken + t.numel() > slots_[slot].elements)
      throw std::invalid_argument("SharedReduction::finish: slot " + std::to_string(slot) +
                                  " fills tensors of its dtype and size");
    t.copy_(sum.narrow(0, taken, t.numel()).view(t.sizes()));
    taken += t.numel();
  }
}

}  // namespace retort::parallel
