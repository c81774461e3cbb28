// engine/observe/memory_tracker.cpp: see memory_tracker.h.
#include "engine/observe/memory_tracker.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <mutex>

namespace retort::engine {
namespace {

// All counters under one mutex: allocations are per tensor (thousands per step), and the
// split at the peak must be one consistent snapshot.
struct Counters {
  std::mutex mutex;
  MemorySplit current, at_peak;
  int64_t device_current = 0, device_peak = 0;
  int64_t offloaded_peak = 0;

  void add(MemoryCategory c, int64_t bytes) {  // bytes may be negative; mutex held
    current.bytes[int(c)] += bytes;
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

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    c10::Device device = inner.device();
    auto* context =
        new Context{std::move(inner), static_cast<int64_t>(bytes), current_memory_category()};
    {
      std::lock_guard<std::mutex> lock(counters().mutex);
      counters().add(context->category, context->bytes);
    }
    return {data, context, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
    MemoryCategory category;
  };
  static void release(void* pointer) {
    auto* context = static_cast<Context*>(pointer);
    {
      std::lock_guard<std::mutex> lock(counters().mutex);
      counters().add(context->category, -context->bytes);
    }
    delete context;  // frees the memory through the base allocator's deleter
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
int64_t MemoryTracker::peak_offloaded_bytes() const {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().offloaded_peak;
}
void MemoryTracker::reset_peak() {
  std::lock_guard<std::mutex> lock(counters().mutex);
  Counters& c = counters();
  c.device_peak = c.device_current;
  c.at_peak = c.current;
  c.offloaded_peak = c.current.of(MemoryCategory::offloaded);
}

void MemoryTracker::retag(const at::Tensor& t, MemoryCategory category) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::DataPtr& data = t.storage().data_ptr();
  if (data.get_deleter() != &TrackingAllocator::release) return;
  auto* context = static_cast<TrackingAllocator::Context*>(data.get_context());
  std::lock_guard<std::mutex> lock(counters().mutex);
  if (context->category == category) return;
  counters().add(context->category, -context->bytes);
  context->category = category;
  counters().add(category, context->bytes);
}

void MemoryTracker::add_outside(MemoryCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  counters().add(category, bytes);
}

}  // namespace retort::engine
