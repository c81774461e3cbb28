// engine/observe/memory_tracker.cpp: see memory_tracker.h.
#include "engine/observe/memory_tracker.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>

namespace retort::engine {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t bytes) const override {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    c10::Device device = inner.device();
    auto* context = new Context{std::move(inner), static_cast<int64_t>(bytes)};
    const int64_t now = g_current.fetch_add(context->bytes) + context->bytes;
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    return {data, context, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void release(void* pointer) {
    auto* context = static_cast<Context*>(pointer);
    g_current.fetch_sub(context->bytes);
    delete context;  // frees the memory through the base allocator's deleter
  }
  c10::Allocator* base_;
};

}  // namespace

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
  return g_current.load();
}
int64_t MemoryTracker::peak_bytes() const {
  return g_peak.load();
}
void MemoryTracker::reset_peak() {
  g_peak.store(g_current.load());
}

}  // namespace retort::engine
