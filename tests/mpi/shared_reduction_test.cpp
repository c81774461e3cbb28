// tests/mpi/shared_reduction_test.cpp: the shared-memory sum over the world group against
// a float64 sum of every rank's inputs (each rank regenerates the others' from their seeds),
// bitwise the same on every rank, over repeated uses of each slot started and finished in a
// different order on each rank; the same with the world split into two hosts (the
// hierarchical sum: shared memory within each, MPI across); and its refusals.
#include "parallel/shared_reduction.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "parallel/communicator.h"
#include "world_group.h"

using namespace retort::parallel;

namespace {

// Slot sizes chosen so that chunks split unevenly, a rank may get an empty chunk (5 elements
// over 4 ranks: chunks are multiples of 16), and a slot is larger than one summing block.
const std::vector<SharedSlot> kSlots = {
    {1000, torch::kFloat}, {37, torch::kDouble}, {5, torch::kFloat}, {9000, torch::kFloat}};

// Rank `rank`'s contribution to `slot` in `round`, as the pieces start() takes: a 2-D
// transposed (non-contiguous) piece first, then the rest.
std::vector<torch::Tensor> inputs(int rank, int slot, int round) {
  torch::manual_seed(1000 * round + 10 * slot + rank);
  const SharedSlot& s = kSlots[slot];
  const int64_t square = s.elements >= 16 ? 4 : 1;
  torch::Tensor first = torch::randn({square, square}, torch::kDouble).to(s.dtype).t();
  torch::Tensor rest =
      (torch::randn({s.elements - square * square}, torch::kDouble) * (rank + 1)).to(s.dtype);
  return {first, rest};
}

torch::Tensor flat(const std::vector<torch::Tensor>& parts) {
  std::vector<torch::Tensor> flats;
  for (const torch::Tensor& p : parts) flats.push_back(p.reshape({-1}));
  return torch::cat(flats);
}

// Three rounds of every slot through `shared`, checked against float64.
void expect_sums_like_float64(Communicator& comm, SharedReduction& shared_reduction) {
  SharedReduction* shared = &shared_reduction;
  const int n = comm.size(), r = comm.rank();
  std::vector<int> order(kSlots.size());
  std::iota(order.begin(), order.end(), 0);
  for (int round = 0; round < 3; ++round) {
    // Each rank starts the slots in its own order and finishes them in reverse, so a rank
    // waits on a slot whose peers are still starting others: the wait must progress them.
    std::rotate(order.begin(), order.begin() + (r + round) % order.size(), order.end());
    for (int slot : order) shared->start(slot, inputs(r, slot, round));
    std::vector<std::vector<torch::Tensor>> outputs(kSlots.size());
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const int slot = *it;
      for (const torch::Tensor& t : inputs(r, slot, round))
        outputs[slot].push_back(torch::full_like(t, -7).contiguous());
      outputs[slot][0] = outputs[slot][0].t();  // a non-contiguous output too
      shared->finish(slot, outputs[slot]);
    }
    for (size_t slot = 0; slot < kSlots.size(); ++slot) {
      torch::Tensor reference = torch::zeros({kSlots[slot].elements}, torch::kDouble);
      for (int k = 0; k < n; ++k) reference += flat(inputs(k, int(slot), round)).to(torch::kDouble);
      // Laid out as the inputs: compare piece by piece against the inputs' layout.
      std::vector<torch::Tensor> got_parts;
      for (const torch::Tensor& t : outputs[slot]) got_parts.push_back(t);
      torch::Tensor got = flat(got_parts);
      const double tolerance = kSlots[slot].dtype == torch::kFloat ? 1e-5 : 1e-12;
      EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), reference, tolerance, tolerance))
          << "slot " << slot << " round " << round << ": max error "
          << (got.to(torch::kDouble) - reference).abs().max().item<double>();
      // Bitwise the same on every rank: rank 0's result broadcast and compared.
      torch::Tensor first = got.clone();
      comm.broadcast(first, 0);
      EXPECT_TRUE(torch::equal(first, got)) << "slot " << slot << " differs from rank 0's";
    }
  }
}

}  // namespace

TEST(SharedReduction, SumsEveryRanksInputsLikeFloat64InAnyOrderOverRounds) {
  Communicator comm(dup_world(), "test");
  std::unique_ptr<SharedReduction> shared = SharedReduction::create(comm, kSlots);
  ASSERT_TRUE(shared) << "all ranks of an mpirun on one machine share a node";
  EXPECT_EQ(shared->hosts(), 1);
  expect_sums_like_float64(comm, *shared);
}

TEST(SharedReduction, AcrossTwoHostsSumsWithinEachThenOverMpiLikeFloat64) {
  Communicator comm(dup_world(), "test");
  if (comm.size() % 4 != 0) GTEST_SKIP() << "two hosts of two ranks or more need 4 ranks";
  const int host = comm.rank() / (comm.size() / 2);
  std::unique_ptr<SharedReduction> shared = SharedReduction::create(comm, kSlots, host);
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->hosts(), 2);
  EXPECT_NE(shared->describe().find("then MPI across"), std::string::npos) << shared->describe();
  expect_sums_like_float64(comm, *shared);
}

TEST(SharedReduction, RefusesWhatItCannotSum) {
  Communicator comm(dup_world(), "test");
  std::unique_ptr<Communicator> alone = Communicator::single("alone");
  EXPECT_FALSE(SharedReduction::create(*alone, kSlots)) << "a group of one needs no sum";
  EXPECT_FALSE(SharedReduction::create(comm, {{8, torch::kBFloat16}})) << "only float, double";
  EXPECT_FALSE(SharedReduction::create(comm, {{8, torch::kFloat}}, comm.rank()))
      << "one rank per host: nothing to share, the plain MPI sum is the right one";
  if (comm.size() > 2) {
    EXPECT_FALSE(SharedReduction::create(comm, {{8, torch::kFloat}}, comm.rank() == 0 ? 0 : 1))
        << "hosts of 1 and " << comm.size() - 1 << " ranks: chunks would not line up";
  }
  std::unique_ptr<SharedReduction> shared = SharedReduction::create(comm, {{8, torch::kFloat}});
  ASSERT_TRUE(shared);
  EXPECT_THROW(shared->start(0, {torch::ones({7})}), std::invalid_argument) << "too few";
  EXPECT_THROW(shared->start(0, {torch::ones({8}, torch::kDouble)}), std::invalid_argument);
  EXPECT_THROW(shared->finish(0, {torch::ones({8})}), std::logic_error) << "never started";
  shared->start(0, {torch::ones({8})});
  EXPECT_THROW(shared->start(0, {torch::ones({8})}), std::logic_error) << "still in flight";
  torch::Tensor out = torch::zeros({8});
  shared->finish(0, {out});
  EXPECT_TRUE(torch::equal(out, torch::full({8}, float(comm.size()))));
}
