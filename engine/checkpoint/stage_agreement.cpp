// engine/checkpoint/stage_agreement.cpp: see stage_agreement.h.
#include "engine/checkpoint/stage_agreement.h"

#include <algorithm>

#include "common/user_error.h"

namespace retort::engine {

void run_agreed_over(parallel::Communicator* group, const std::function<void()>& phase) {
  if (!group || group->size() == 1) return phase();
  std::string error;
  try {
    phase();
  } catch (const UserError& e) {
    error = e.what();
  }
  // Max of (size - rank) over the failed members picks the lowest failing rank.
  torch::Tensor failed =
      torch::tensor({error.empty() ? 0 : group->size() - group->rank()}, torch::kInt);
  group->all_reduce(failed, parallel::ReduceOp::Max);
  if (failed.item<int>() == 0) return;
  const int source = group->size() - failed.item<int>();
  constexpr int64_t kMaxMessage = 2048;
  torch::Tensor message = torch::zeros({kMaxMessage}, torch::kByte);
  if (group->rank() == source)
    std::copy_n(error.begin(), std::min<int64_t>(int64_t(error.size()), kMaxMessage - 1),
                message.data_ptr<uint8_t>());
  group->broadcast(message, source);
  throw UserError(std::string(reinterpret_cast<const char*>(message.data_ptr<uint8_t>())));
}

}  // namespace retort::engine
