// engine/observe/memory_tracker.cpp: see memory_tracker.h.
#include "engine/observe/memory_tracker.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <mutex>
#include <unordered_map>

#include "engine/observe/cuda_memory_trace.h"

namespace retort::engine {
namespace {

// All counters under one mutex: allocations are per tensor (thousands per step), and the
// split at the peak must be one consistent snapshot.
struct Counters {
  std::mutex mutex;
  MemorySplit current, at_peak;
  MemorySplit category_peaks;  // each category's own largest, whenever it was
  int64_t device_current = 0, device_peak = 0;
  int64_t offloaded_peak = 0;

  void add(MemoryCategory c, int64_t bytes) {  // bytes may be negative; mutex held
    current.bytes[int(c)] += bytes;
    category_peaks.bytes[int(c)] = std::max(category_peaks.of(c), current.of(c));
    if (c == MemoryCategory::offloaded) {
      offloaded_peak = std::max(offloaded_peak, current.of(c));
      return;
    }
    device_current += bytes;
    if (device_current > device_peak) {
      device_peak = device_current;
      at_peak = current;
    }
  }
};

Counters& counters() {
  static Counters c;
  return c;
}

// Files every CPU allocation under the current memory category. Its DataPtrs are plain
// (context == data, freed by release()), as c10's raw_allocate / raw_deallocate require:
// oneDNN allocates its buffers that way (bfloat16 matrix products among them). The size and
// category of each block live in a table beside it, keyed by its address.
class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = base_->allocate(bytes);
    // A block the base allocator frees through a context of its own cannot be handed out
    // plain; c10's CPU allocator never does that.
    TORCH_INTERNAL_ASSERT(inner.get() == inner.get_context() || inner.get() == nullptr,
                          "the base CPU allocator's blocks carry a context");
    void* data = inner.release_context();
    MemoryTracker::note_allocated(data, static_cast<int64_t>(bytes));
    return {data, data, &release, inner.device()};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  struct Block {
    int64_t bytes;
    MemoryCategory category;
  };
  static std::unordered_map<void*, Block>& blocks() {  // counters().mutex held
    static std::unordered_map<void*, Block> table;
    return table;
  }
  static void release(void* data) {
    if (!data) return;
    MemoryTracker::note_released(data);
    base_deleter()(data);
  }
  // The base allocator's deleter, set when the tracker is installed.
  static c10::DeleterFnPtr& base_deleter() {
    static c10::DeleterFnPtr deleter = nullptr;
    return deleter;
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

int64_t MemorySplit::device() const {
  int64_t total = 0;
  for (int c = 0; c < kMemoryCategories; ++c)
    if (c != int(MemoryCategory::offloaded)) total += bytes[c];
  return total;
}

MemoryTracker& MemoryTracker::install() {
  static TrackingAllocator allocator(c10::GetCPUAllocator());
  static bool installed = [] {
    TrackingAllocator::base_deleter() = c10::GetCPUAllocator()->raw_deleter();
    TORCH_INTERNAL_ASSERT(TrackingAllocator::base_deleter(),
                          "the base CPU allocator has no raw deleter");
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
    return true;
  }();
  (void)installed;
  static MemoryTracker tracker;
  return tracker;
}

int64_t MemoryTracker::current_bytes() const {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().device_current;
}
int64_t MemoryTracker::peak_bytes() const {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().device_peak;
}
MemorySplit MemoryTracker::current_split() const {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().current;
}
MemorySplit MemoryTracker::peak_split() const {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().at_peak;
}
MemorySplit MemoryTracker::category_peaks() const {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().category_peaks;
}
int64_t MemoryTracker::peak_offloaded_bytes() const {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().offloaded_peak;
}
void MemoryTracker::reset_peak() {
  std::lock_guard<std::mutex> lock(counters().mutex);
  Counters& c = counters();
  c.device_peak = c.device_current;
  c.at_peak = c.current;
  c.category_peaks = c.current;
  c.offloaded_peak = c.current.of(MemoryCategory::offloaded);
}

void MemoryTracker::note_allocated(void* data, int64_t bytes) {
  if (!data) return;
  const MemoryCategory category = current_memory_category();
  std::lock_guard<std::mutex> lock(counters().mutex);
  TrackingAllocator::blocks()[data] = TrackingAllocator::Block{bytes, category};
  counters().add(category, bytes);
}

void MemoryTracker::note_released(void* data) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  auto it = TrackingAllocator::blocks().find(data);
  if (it == TrackingAllocator::blocks().end()) return;  // allocated before the tracker came
  counters().add(it->second.category, -it->second.bytes);
  TrackingAllocator::blocks().erase(it);
}

void MemoryTracker::retag(const at::Tensor& t, MemoryCategory category) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::DataPtr& data = t.storage().data_ptr();
  // CPU blocks through the tracking allocator; GPU blocks through the CUDA trace.
  if (t.device().is_cpu() && data.get_deleter() != &TrackingAllocator::release) return;
  std::lock_guard<std::mutex> lock(counters().mutex);
  auto it = TrackingAllocator::blocks().find(data.get());
  if (it == TrackingAllocator::blocks().end() || it->second.category == category) return;
  TrackingAllocator::Block& block = it->second;
  counters().add(block.category, -block.bytes);
  block.category = category;
  counters().add(category, block.bytes);
}

void MemoryTracker::add_outside(MemoryCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  counters().add(category, bytes);
}

}  // namespace retort::engine
