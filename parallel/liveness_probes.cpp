// parallel/liveness_probes.cpp: see liveness_probes.h.
#include "parallel/liveness_probes.h"

#include <set>

namespace retort::parallel {
namespace {

constexpr int kProbe = 1, kAnswer = 2;
constexpr int kAnswerBytes = 200;
constexpr size_t kAnswersKept = 64;  // answers older than that were long delivered

}  // namespace

void answer_probes(MPI_Comm comm, const std::string& line, LivenessAnswers& buffers) {
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kProbe, comm, &arrived, &status);
    if (!arrived) return;
    int asker = 0;
    MPI_Recv(&asker, 1, MPI_INT, status.MPI_SOURCE, kProbe, comm, MPI_STATUS_IGNORE);
    if (buffers.in_flight.size() > kAnswersKept) buffers.in_flight.pop_front();
    buffers.in_flight.push_back(line);
    buffers.in_flight.back().resize(kAnswerBytes - 1);
    buffers.in_flight.back().push_back('\0');
    MPI_Request request;
    MPI_Isend(buffers.in_flight.back().data(), kAnswerBytes, MPI_CHAR, asker, kAnswer, comm,
              &request);
    MPI_Request_free(&request);
  }
}

void send_probes(MPI_Comm comm, const std::vector<int>& members, int my_rank) {
  // The probe's buffer, alive for the process (fire-and-forget); one rank per process.
  static const int* const sent_rank = new int(my_rank);
  for (int r : members) {
    if (r == my_rank) continue;
    MPI_Request request;
    MPI_Isend(sent_rank, 1, MPI_INT, r, kProbe, comm, &request);
    MPI_Request_free(&request);
  }
}

void collect_answers(MPI_Comm comm, std::vector<std::pair<int, std::string>>& answers) {
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kAnswer, comm, &arrived, &status);
    if (!arrived) return;
    char text[kAnswerBytes];
    MPI_Recv(text, kAnswerBytes, MPI_CHAR, status.MPI_SOURCE, kAnswer, comm, MPI_STATUS_IGNORE);
    text[kAnswerBytes - 1] = 0;
    answers.emplace_back(status.MPI_SOURCE, text);
  }
}

std::vector<int> silent_members(const std::vector<int>& members, int my_rank,
                                const std::vector<std::pair<int, std::string>>& answers) {
  std::set<int> answered;
  for (const auto& a : answers) answered.insert(a.first);
  std::vector<int> silent;
  for (int r : members)
    if (r != my_rank && !answered.count(r)) silent.push_back(r);
  return silent;
}

}  // namespace retort::parallel
