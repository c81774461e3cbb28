// parallel/handle.h: a pending communication (Handle: MPI requests, or device work polled and
// waited for through callbacks) and the account of time a process spends blocked waiting for
// communication (exposed_communication_seconds). Every backend (parallel/backend.h) returns
// Handles, so a caller waits the same way whatever moved its tensors.
#pragma once
#include <mpi.h>

#include <chrono>
#include <functional>
#include <vector>

#include "parallel/collective_watchdog.h"

namespace retort::parallel {

// Seconds this process has spent blocked in communication since start (or the last reset):
// in Handle::wait (which every blocking collective, send and receive goes through), in
// broadcast and in barrier. Time an asynchronous operation overlaps with computation is not
// counted: this is the exposed part. Waits for a slower peer count too, as they should.
double exposed_communication_seconds();
void reset_exposed_communication_seconds();
// Adds the time from its construction to its destruction to the exposed communication time
// (for waits that are not on MPI requests: shared_reduction.h).
class ExposedWait {
 public:
  ExposedWait();
  ~ExposedWait();

 private:
  std::chrono::steady_clock::time_point start_;
};

// A pending non-blocking operation. wait() completes it (and runs its finishing step, e.g.
// copying a gathered buffer into place); destruction waits too.
class Handle {
 public:
  Handle() = default;
  Handle(MPI_Request request, std::function<void()> finish);
  // Several requests (a message split into pieces) completed together.
  Handle(std::vector<MPI_Request> requests, std::function<void()> finish);
  // Work on a device (NCCL): `ready` says without blocking whether it is done; `finish` waits
  // for it.
  Handle(std::function<bool()> ready, std::function<void()> finish);
  Handle(Handle&&) noexcept;
  Handle& operator=(Handle&&) noexcept;
  ~Handle();
  void wait();
  bool test();  // drives progress without blocking; true once complete (finish has then run)
  bool pending() const { return !requests_.empty() || static_cast<bool>(ready_); }
  // This handle with `after` run once its own finishing step has (a staged operation's copy
  // back); a handle with nothing pending runs it at once.
  Handle then(std::function<void()> after) &&;
  // What the wait is for, named if it times out (collective_watchdog.h).
  void set_label(const WaitLabel& label) { label_ = label; }

 private:
  std::vector<MPI_Request> requests_;
  std::function<bool()> ready_;
  std::function<void()> finish_;
  WaitLabel label_;
};

}  // namespace retort::parallel
