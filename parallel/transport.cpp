// parallel/transport.cpp: see transport.h.
#include "parallel/transport.h"

#include <utility>

#include "common/user_error.h"

namespace retort::parallel {

const char* transport_name(Transport transport) {
  return transport == Transport::host_staged ? "host-staged MPI" : "direct";
}

namespace {

// The group ranks of the first two that share a GPU, or {-1, -1}.
std::pair<int, int> shared_gpu(const std::vector<RankPlace>& places) {
  for (size_t a = 0; a < places.size(); ++a)
    for (size_t b = a + 1; b < places.size(); ++b)
      if (places[a].gpu >= 0 && places[a].gpu == places[b].gpu && places[a].host == places[b].host)
        return {int(a), int(b)};
  return {-1, -1};
}

}  // namespace

Transport transport_for(TransportChoice choice, const std::vector<RankPlace>& places,
                        const std::string& group) {
  if (choice == TransportChoice::host_staged) return Transport::host_staged;
  const auto [a, b] = shared_gpu(places);
  if (a < 0) return Transport::direct;
  if (choice == TransportChoice::automatic) return Transport::host_staged;
  throw UserError("parallel.gpu_transport=nccl: ranks " + std::to_string(a) + " and " +
                  std::to_string(b) + " of the " + group + " group share GPU " +
                  std::to_string(places[a].gpu) +
                  ", and NCCL refuses two ranks of one communicator on one device; use "
                  "parallel.gpu_transport=automatic (host-staged MPI there) or give each rank "
                  "its own GPU");
}

int gpu_for_local_rank(int local_rank, int visible_gpus, int gpus_per_node) {
  if (visible_gpus <= 0) throw UserError("runtime.device=cuda: no GPU is visible to this process");
  if (gpus_per_node > visible_gpus)
    throw UserError("runtime.gpus_per_node=" + std::to_string(gpus_per_node) +
                    ", but this process sees " + std::to_string(visible_gpus) + " GPU(s)");
  const int gpus = gpus_per_node > 0 ? gpus_per_node : visible_gpus;
  return local_rank % gpus;
}

}  // namespace retort::parallel
