// parallel/handle.cpp: see handle.h.
#include "parallel/handle.h"

#include <atomic>
#include <string>

#include "common/trace_span.h"

namespace retort::parallel {
namespace {

std::atomic<int64_t> blocked_nanoseconds{0};

}  // namespace

double exposed_communication_seconds() {
  return blocked_nanoseconds.load() * 1e-9;
}
void reset_exposed_communication_seconds() {
  blocked_nanoseconds = 0;
}
ExposedWait::ExposedWait() : start_(std::chrono::steady_clock::now()) {}
ExposedWait::~ExposedWait() {
  blocked_nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - start_)
                             .count();
}

Handle::Handle(MPI_Request request, std::function<void()> finish) : finish_(std::move(finish)) {
  if (request != MPI_REQUEST_NULL) requests_.push_back(request);
}
Handle::Handle(std::vector<MPI_Request> requests, std::function<void()> finish)
    : requests_(std::move(requests)), finish_(std::move(finish)) {}
Handle::Handle(std::function<bool()> ready, std::function<void()> finish)
    : ready_(std::move(ready)), finish_(std::move(finish)) {}
Handle::Handle(Handle&& other) noexcept {
  *this = std::move(other);
}
Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    if (pending()) wait();
    requests_ = std::move(other.requests_);
    ready_ = std::move(other.ready_);
    finish_ = std::move(other.finish_);
    label_ = other.label_;
    other.requests_.clear();
    other.ready_ = nullptr;
    other.finish_ = nullptr;
  }
  return *this;
}
Handle::~Handle() {
  if (pending()) wait();
}
void Handle::wait() {
  if (!requests_.empty()) {
    TraceSpan span([this] {
      return std::string("comm ") + label_.op + " [" +
             (label_.group_name ? *label_.group_name : std::string("?")) + "]";
    });
    ExposedWait blocked;
    wait_or_abort(requests_, label_);
  }
  requests_.clear();
  const bool device_work = static_cast<bool>(ready_);
  ready_ = nullptr;
  if (finish_) {
    auto finish = std::move(finish_);
    finish_ = nullptr;
    if (device_work) {  // the wait is in finish (NCCL work)
      ExposedWait blocked;
      finish();
    } else {
      finish();
    }
  }
}
Handle Handle::then(std::function<void()> after) && {
  std::function<void()> first = std::move(finish_);
  finish_ = [first, after] {
    if (first) first();
    after();
  };
  if (!pending()) {
    wait();
    return Handle();
  }
  return std::move(*this);
}

bool Handle::test() {
  if (ready_ && !ready_()) return false;
  if (!requests_.empty()) {
    int done = 0;
    MPI_Testall(int(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    if (!done) return false;
  }
  wait();
  return true;
}

}  // namespace retort::parallel
