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

#include "parallel/collective_watchdog.h"
#include "parallel/communicator.h"

namespace retort::parallel {
namespace {

constexpr int64_t kLine = 64;
constexpr int kContributed = 0, kSummed = 1;

int64_t round_up(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

// dst[i] = sum over k (in rank order) of parts[k][i], for i in [0, n), then into every part.
template <typename T>
void sum_into_all(const std::vector<T*>& parts, int64_t n) {
  constexpr int64_t kBlock = 2048;
  alignas(64) T acc[kBlock];
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t m = std::min(kBlock, n - begin);
    std::memcpy(acc, parts[0] + begin, m * sizeof(T));
    for (size_t k = 1; k < parts.size(); ++k) {
      const T* part = parts[k] + begin;
      for (int64_t i = 0; i < m; ++i) acc[i] += part[i];
    }
    for (T* part : parts) std::memcpy(part + begin, acc, m * sizeof(T));
  }
}

}  // namespace

std::unique_ptr<SharedReduction> SharedReduction::create(Communicator& group,
                                                         const std::vector<SharedSlot>& slots) {
  if (group.size() == 1 || group.mpi() == MPI_COMM_NULL) return nullptr;
  bool usable = true;
  for (const SharedSlot& s : slots)
    usable = usable && (s.dtype == torch::kFloat || s.dtype == torch::kDouble);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(group.mpi(), MPI_COMM_TYPE_SHARED, group.rank(), MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  // Every rank must agree: one rank on another node makes the whole group fall back.
  int all_usable = usable && node_size == group.size();
  MPI_Allreduce(MPI_IN_PLACE, &all_usable, 1, MPI_INT, MPI_MIN, group.mpi());
  if (!all_usable) {
    MPI_Comm_free(&node);
    return nullptr;
  }
  return std::unique_ptr<SharedReduction>(new SharedReduction(group, slots, node));
}

SharedReduction::SharedReduction(Communicator& group, const std::vector<SharedSlot>& slots,
                                 MPI_Comm node)
    : group_(group),
      slots_(slots),
      node_(node),
      generation_(slots.size(), 0),
      in_flight_(slots.size(), false),
      summed_(slots.size(), false),
      label_name_(group.name() + " (shared memory)") {
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
  // Ranks in node_ are numbered as in the group (the split's key was the group rank).
  segments_.resize(group.size());
  for (int r = 0; r < group.size(); ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    MPI_Win_shared_query(window_, r, &size, &unit, &segments_[r]);
  }
  MPI_Barrier(node_);  // every header zeroed before anyone looks at it
}

SharedReduction::~SharedReduction() {
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
  return torch::from_blob(data(group_.rank(), slot), {slots_[slot].elements},
                          torch::TensorOptions().dtype(slots_[slot].dtype));
}

bool SharedReduction::all_reached(int kind, int slot, uint64_t generation) const {
  for (int r = 0; r < group_.size(); ++r)
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
  __atomic_store_n(counter(group_.rank(), kContributed, slot), generation_[slot], __ATOMIC_RELEASE);
  progress();
}

void SharedReduction::sum_my_chunk(int slot) {
  const SharedSlot& s = slots_[slot];
  const int64_t chunk = round_up((s.elements + group_.size() - 1) / group_.size(), 16);
  const int64_t begin = std::min(s.elements, group_.rank() * chunk);
  const int64_t n = std::min(s.elements - begin, chunk);
  if (s.dtype == torch::kFloat) {
    std::vector<float*> parts;
    for (int r = 0; r < group_.size(); ++r)
      parts.push_back(reinterpret_cast<float*>(data(r, slot)) + begin);
    sum_into_all(parts, n);
  } else {
    std::vector<double*> parts;
    for (int r = 0; r < group_.size(); ++r)
      parts.push_back(reinterpret_cast<double*>(data(r, slot)) + begin);
    sum_into_all(parts, n);
  }
  summed_[slot] = true;
  __atomic_store_n(counter(group_.rank(), kSummed, slot), generation_[slot], __ATOMIC_RELEASE);
}

void SharedReduction::progress() {
  for (size_t slot = 0; slot < slots_.size(); ++slot)
    if (in_flight_[slot] && !summed_[slot] &&
        all_reached(kContributed, int(slot), generation_[slot]))
      sum_my_chunk(int(slot));
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
