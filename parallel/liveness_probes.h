// parallel/liveness_probes.h: the probe-and-answer exchange both watchdogs use to tell a silent
// rank from a busy one (collective_watchdog.h for MPI waits, device_watchdog.h for NCCL's).
// On a communicator private to one watchdog (ranks = world ranks): a waiting rank sends its
// rank as a probe to each other member of the group it waits on; every rank that is itself
// waiting answers each probe with a fixed-size line saying what it waits in. Sends are
// fire-and-forget; the answers' buffers live in a LivenessAnswers until long delivered.
// No torch here.
#pragma once
#include <mpi.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace retort::parallel {

// What this rank answers with, kept until MPI has surely sent it.
struct LivenessAnswers {
  std::deque<std::string> in_flight;
};

// Answers every probe that has arrived on `comm` with `line`.
void answer_probes(MPI_Comm comm, const std::string& line, LivenessAnswers& buffers);
// Probes each member of `members` other than `my_rank`.
void send_probes(MPI_Comm comm, const std::vector<int>& members, int my_rank);
// Appends the answers that have arrived: (world rank, its line).
void collect_answers(MPI_Comm comm, std::vector<std::pair<int, std::string>>& answers);
// The members other than `my_rank` that sent no answer.
std::vector<int> silent_members(const std::vector<int>& members, int my_rank,
                                const std::vector<std::pair<int, std::string>>& answers);

}  // namespace retort::parallel
