// tests/mpi/comm_volume_test.cpp: bytes communicated by one forward + backward of the model
// under TP and STP, per operation, against the analytic count, so no hidden traffic creeps
// in. With activations of b*s*h elements (4 bytes each), L blocks, world as the TP group:
//   TP:  all-reduce  = (1 embedding + 2L forward + 2L backward + 1 head input) * b*s*h
//                      + 3 per-token reductions of the cross-entropy (max, target, sum-exp)
//   STP: all-gather  = (2L + 1 head) forward + (2L + 1 embedding) backward, of b*s*h
//        reduce-scatter = (2L + 1 embedding) forward + (2L + 1 head) backward, of b*s*h
//        all-reduce  = the 3 cross-entropy reductions
// (all-gather counts the gathered size, reduce-scatter the full input). Gradient sync of
// parameters replicated over TP adds (2L + 1) norm vectors of h under STP and none under TP.
// Full activation checkpointing runs each block's forward again in backward, with its
// communication: + 2L all-reduces (TP), + 2L all-gathers and 2L reduce-scatters (STP).
// Selective checkpointing recomputes only local parts (attention core, SwiGLU product): + 0.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "engine/optim/grad_sync.h"
#include "layers/model.h"

using namespace retort;
using namespace retort::layers;

namespace {

int64_t bytes(const parallel::Communicator& c, const std::string& op) {
  auto it = c.counters().find(op);
  return it == c.counters().end() ? 0 : it->second.bytes;
}

}  // namespace

TEST(CommVolume, MatchesAnalyticCountUnderTpAndStp) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  parallel::Communicator comm(dup, "tp");
  const int n = comm.size();
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden = 64;
  c.layers = 3;
  c.heads = 4 * n;
  c.kv_heads = n;
  c.ffn_hidden = 32 * n;
  const int64_t b = 2, s = 8 * n, L = c.layers, h = c.hidden;
  const int64_t act = b * s * h * 4, per_token = b * s * 4;
  torch::manual_seed(1);
  torch::Tensor tokens = torch::randint(c.vocab_size, {b, s}, torch::kLong);
  torch::Tensor targets = torch::randint(c.vocab_size, {b, s}, torch::kLong);
  for (Checkpointing mode : {Checkpointing::none, Checkpointing::full, Checkpointing::selective})
    for (bool sequence : {false, true}) {
      TensorParallel tp{&comm, sequence};
      ParameterStore store(1, torch::kFloat, tp.position());
      LlamaModel model(c, store, tp);
      model.set_recompute({mode, nullptr});
      comm.reset_counters();
      model.loss_sum(tokens, targets).backward();
      std::map<std::string, int64_t> expected;
      if (!sequence) {
        expected["all_reduce"] = (1 + 2 * L + 2 * L + 1) * act + 3 * per_token;
      } else {
        expected["all_gather"] = (2 * L + 1 + 2 * L + 1) * act;
        expected["reduce_scatter"] = (2 * L + 1 + 2 * L + 1) * act;
        expected["all_reduce"] = 3 * per_token;
      }
      if (mode == Checkpointing::full)
        for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"})
          if ((std::string(op) == "all_reduce") != sequence) expected[op] += 2 * L * act;
      std::map<std::string, int64_t> measured;
      for (const auto& [op, counter] : comm.counters()) measured[op] = counter.bytes;
      comm.reset_counters();
      engine::sum_partial_tp_grads(store, tp);
      const int64_t sync_expected = sequence ? (2 * L + 1) * h * 4 : 0;
      if (comm.rank() == 0) {
        std::printf(
            "%s, TP%d, checkpointing %s, b=%lld s=%lld h=%lld L=%lld: bytes per rank per "
            "step\n",
            sequence ? "STP" : "TP", n, enum_name(mode).c_str(), (long long)b, (long long)s,
            (long long)h, (long long)L);
        std::printf("  | %-22s | %12s | %12s |\n", "operation", "measured", "analytic");
        for (const auto& [op, value] : expected)
          std::printf("  | %-22s | %12lld | %12lld |\n", op.c_str(), (long long)measured[op],
                      (long long)value);
        std::printf("  | %-22s | %12lld | %12lld |\n", "grad sync all_reduce",
                    (long long)bytes(comm, "all_reduce"), (long long)sync_expected);
      }
      EXPECT_EQ(measured, expected) << (sequence ? "STP" : "TP") << " " << enum_name(mode);
      EXPECT_EQ(bytes(comm, "all_reduce"), sync_expected);
    }
}
