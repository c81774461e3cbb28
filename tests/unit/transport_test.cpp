// tests/unit/transport_test.cpp: the rules of parallel/transport.h, without MPI or a GPU: which
// transport a group uses given where its ranks keep their tensors, and which GPU a rank takes
// from its local rank.
#include "parallel/transport.h"

#include <gtest/gtest.h>

#include "common/user_error.h"

using namespace retort;
using namespace retort::parallel;

TEST(Transport, CpuRanksMoveTensorsDirectlyUnlessStagingIsAskedFor) {
  const std::vector<RankPlace> cpu = {{0, -1}, {0, -1}, {4, -1}};
  EXPECT_EQ(transport_for(TransportChoice::automatic, cpu, "tp"), Transport::direct);
  EXPECT_EQ(transport_for(TransportChoice::nccl, cpu, "tp"), Transport::direct);
  EXPECT_EQ(transport_for(TransportChoice::host_staged, cpu, "tp"), Transport::host_staged);
}

TEST(Transport, RanksSharingAGpuAreStagedThroughTheHost) {
  const std::vector<RankPlace> own = {{0, 0}, {0, 1}, {8, 0}, {8, 1}};  // GPU 0 on two hosts
  EXPECT_EQ(transport_for(TransportChoice::automatic, own, "dp"), Transport::direct);
  const std::vector<RankPlace> shared = {{0, 0}, {0, 1}, {0, 1}};
  EXPECT_EQ(transport_for(TransportChoice::automatic, shared, "dp"), Transport::host_staged);
  EXPECT_EQ(transport_for(TransportChoice::host_staged, own, "dp"), Transport::host_staged);
  try {
    transport_for(TransportChoice::nccl, shared, "dp");
    FAIL() << "nccl forced onto a shared GPU was accepted";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parallel.gpu_transport=nccl"), std::string::npos) << message;
    EXPECT_NE(message.find("ranks 1 and 2 of the dp group share GPU 1"), std::string::npos)
        << message;
  }
}

TEST(Transport, EachRankTakesTheGpuOfItsLocalRank) {
  EXPECT_EQ(gpu_for_local_rank(0, 8, 0), 0);
  EXPECT_EQ(gpu_for_local_rank(5, 8, 0), 5);
  EXPECT_EQ(gpu_for_local_rank(3, 1, 0), 0);  // four ranks on one GPU: all on GPU 0
  EXPECT_EQ(gpu_for_local_rank(6, 8, 4), 2);  // gpus_per_node 4 of 8 visible
  EXPECT_THROW(gpu_for_local_rank(0, 0, 0), UserError);
  EXPECT_THROW(gpu_for_local_rank(0, 2, 4), UserError);
}
