// parallel/collective_watchdog.h: no rank waits forever. Every blocking wait on MPI requests
// (Handle::wait, so every collective, send and receive of a Communicator), and every wait of
// the shared-memory DP sum (shared_reduction.h), goes through
// wait_or_abort: with a timeout set (runtime.collective_timeout_s) it polls, and from half the
// timeout on asks the group's other members, over a private duplicate of MPI_COMM_WORLD,
// whether they are alive; any rank that is itself waiting answers with what it waits in.
// At the timeout it prints which operation on which group stalled, who did not answer (a
// frozen or dead rank) and what the others wait in, then ends the job (MPI_Abort); a rank whose
// whole group answered waits half a timeout more first, so that the rank waiting on the silent
// one is the one to report. A rank
// that dies outright is also caught by mpirun, which ends the job when a process exits.
// No torch here.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace retort::parallel {

// Collective over MPI_COMM_WORLD, once per process after MPI_Init (MpiRuntime and the MPI
// test main call it): creates the private communicator the liveness probes travel on.
void init_collective_watchdog();
// The communicator device_watchdog.h's probes travel on (made by init_collective_watchdog).
MPI_Comm device_liveness_communicator();
// World ranks of the members of `group`.
std::vector<int> world_ranks_of(MPI_Comm group);
// "2, 3 on host1; 5 on host2": world ranks grouped by the host they run on.
std::string ranks_with_hosts(const std::vector<int>& ranks);
// Seconds a wait may last before the job is ended; 0 turns the watchdog off (plain waits).
void set_collective_timeout(double seconds);
double collective_timeout();

// What a wait is for: the operation and the group (named, with its MPI communicator).
struct WaitLabel {
  const char* op = "wait";
  const std::string* group_name = nullptr;
  MPI_Comm group = MPI_COMM_NULL;
};

// Where a stop signal is looked up (engine_train: engine::stop_signal_received; 0 for none).
// When a process or a whole host dies, mpirun sends SIGTERM to every other rank and SIGKILL
// a second later: a rank whose wait has not ended shortly after a stop signal prints the
// ranks it waits for, with their hosts (after mpirun's own message naming the dead host), and
// carries on waiting (a pre-emption of a healthy job still saves).
void watch_stop_signal(int (*stop_signal_received)());

// MPI_Waitall on `requests`, or, past the timeout, a report on stderr and MPI_Abort.
void wait_or_abort(std::vector<MPI_Request>& requests, const WaitLabel& label);
// The same for a wait on anything else (shared memory): polls `done` until it returns true.
void wait_or_abort(const std::function<bool()>& done, const WaitLabel& label);

}  // namespace retort::parallel
