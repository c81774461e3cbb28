// tests/mpi/device_communicator_test.cpp: every Communicator operation on the tensors of the
// rank's device, through each transport, against its definition computed on the CPU. On a
// machine with GPUs each rank takes the GPU of its local rank and the direct transport is
// NCCL (where every rank has its own GPU); without one the tensors are CPU tensors and the
// direct transport is MPI. Host-staged runs on either: that is the path ranks sharing a GPU
// take, and here on CPU tensors its copies in and out are what is checked. float32 and
// bfloat16 (sums in float32, rounded once), uneven variable collectives (ZeRO-1's), a ring of
// sends and receives with two tags in flight, and async handles waited in reverse order. And
// NCCL itself on a group of one, where a GPU is.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallel/communicator.h"
#include "parallel/nccl_backend.h"
#include "world_group.h"

using namespace retort::parallel;

namespace {

// The rank's device: the GPU of its local rank where the process sees GPUs, else the CPU.
torch::Device rank_device() {
  if (!torch::cuda::is_available()) return torch::kCPU;
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  return torch::Device(torch::kCUDA, local % int(torch::cuda::device_count()));
}

// The same values on every rank for a seed.
torch::Tensor seeded(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kDouble);
}

void check_every_operation(Communicator& comm, torch::Device device) {
  const int r = comm.rank(), n = comm.size();
  auto on = [&](const torch::Tensor& t, torch::ScalarType type) { return t.to(device, type); };
  auto host = [](const torch::Tensor& t) { return t.to(torch::kCPU, torch::kDouble); };

  // all_reduce, float32 and bfloat16 (float32 sum of the bf16 values, rounded once)
  for (torch::ScalarType type : {torch::kFloat, torch::kBFloat16}) {
    torch::Tensor t = on(seeded({37}, 100 + r), type);
    comm.all_reduce(t);
    torch::Tensor sum = torch::zeros({37}, torch::kDouble);
    for (int k = 0; k < n; ++k) sum += seeded({37}, 100 + k).to(type).to(torch::kDouble);
    EXPECT_TRUE(torch::allclose(host(t), sum.to(type).to(torch::kDouble), 0, 0) ||
                type == torch::kFloat && torch::allclose(host(t), sum, 1e-6, 1e-6))
        << "all_reduce " << c10::toString(type) << " on " << device;
  }
  torch::Tensor biggest = on(torch::full({3}, double(r)), torch::kFloat);
  comm.all_reduce(biggest, ReduceOp::Max);
  EXPECT_TRUE(torch::equal(host(biggest), torch::full({3}, double(n - 1), torch::kDouble)));

  // all_gather and reduce_scatter (block and variable sizes: ZeRO-1's)
  torch::Tensor gathered = comm.all_gather(on(seeded({2, 5}, 200 + r), torch::kFloat), 0);
  std::vector<torch::Tensor> parts;
  for (int k = 0; k < n; ++k) parts.push_back(seeded({2, 5}, 200 + k).to(torch::kFloat));
  EXPECT_TRUE(torch::equal(host(gathered), torch::cat(parts).to(torch::kDouble)));
  torch::Tensor scattered = comm.reduce_scatter(on(seeded({4 * n}, 300 + r), torch::kFloat), 0);
  torch::Tensor full_sum = torch::zeros({4 * n}, torch::kDouble);
  for (int k = 0; k < n; ++k) full_sum += seeded({4 * n}, 300 + k).to(torch::kFloat);
  EXPECT_TRUE(torch::allclose(host(scattered), full_sum.narrow(0, 4 * r, 4), 1e-6, 1e-6));
  std::vector<int64_t> counts;
  int64_t total = 0, offset = 0;
  for (int k = 0; k < n; ++k) {
    counts.push_back(3 + 2 * k);
    if (k < r) offset += counts.back();
    total += counts.back();
  }
  torch::Tensor mine = on(torch::zeros({counts[r]}), torch::kFloat);
  comm.reduce_scatter_v_async(on(seeded({total}, 400 + r), torch::kFloat), mine, counts).wait();
  torch::Tensor v_sum = torch::zeros({total}, torch::kDouble);
  for (int k = 0; k < n; ++k) v_sum += seeded({total}, 400 + k).to(torch::kFloat);
  EXPECT_TRUE(torch::allclose(host(mine), v_sum.narrow(0, offset, counts[r]), 1e-6, 1e-6));
  torch::Tensor whole = on(torch::zeros({total}), torch::kFloat);
  comm.all_gather_v_async(on(seeded({counts[r]}, 500 + r), torch::kFloat), whole, counts).wait();
  for (int k = 0, at = 0; k < n; at += counts[k], ++k)
    EXPECT_TRUE(torch::equal(host(whole).narrow(0, at, counts[k]),
                             seeded({counts[k]}, 500 + k).to(torch::kFloat).to(torch::kDouble)));

  // broadcast from the last rank
  torch::Tensor b = on(seeded({6}, 600 + r), torch::kBFloat16);
  comm.broadcast(b, n - 1);
  EXPECT_TRUE(
      torch::equal(host(b), seeded({6}, 600 + n - 1).to(torch::kBFloat16).to(torch::kDouble)));

  // A ring with two messages in flight per neighbour (tags 1 and 2), waited in reverse order.
  if (n > 1) {
    const int next = (r + 1) % n, previous = (r + n - 1) % n;
    torch::Tensor out1 = on(seeded({8}, 700 + r), torch::kFloat);
    torch::Tensor out2 = on(seeded({5}, 800 + r), torch::kFloat);
    torch::Tensor in1 = on(torch::zeros({8}), torch::kFloat);
    torch::Tensor in2 = on(torch::zeros({5}), torch::kFloat);
    Handle s1 = comm.send_async(out1, next, 1), s2 = comm.send_async(out2, next, 2);
    Handle r1 = comm.recv_async(in1, previous, 1), r2 = comm.recv_async(in2, previous, 2);
    r2.wait();
    r1.wait();
    s2.wait();
    s1.wait();
    EXPECT_TRUE(
        torch::equal(host(in1), seeded({8}, 700 + previous).to(torch::kFloat).to(torch::kDouble)));
    EXPECT_TRUE(
        torch::equal(host(in2), seeded({5}, 800 + previous).to(torch::kFloat).to(torch::kDouble)));
  }
}

}  // namespace

TEST(DeviceCommunicator, EveryOperationDirect) {
  Communicator comm(dup_world(), "test");
  check_every_operation(comm, rank_device());
}

TEST(DeviceCommunicator, EveryOperationHostStaged) {
  Communicator comm(dup_world(), "test");
  comm.set_transport(Transport::host_staged);
  check_every_operation(comm, rank_device());
}

// NCCL itself on a group of one (a Communicator skips NCCL there: nothing to move), so a machine
// with one GPU still runs every NCCL call: each operation's result is its input, sends and
// receives to oneself complete together (grouped at the wait), and the stream ordering and
// events hold.
TEST(DeviceCommunicator, NcclOnOneRankRunsEveryCall) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
#ifndef RETORT_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#endif
  const torch::Device gpu = rank_device();
  auto backend = std::make_shared<NcclBackend>(MPI_COMM_SELF, int(gpu.index()), "one rank");
  torch::Tensor t = seeded({33}, 900).to(gpu, torch::kFloat);
  const torch::Tensor before = t.clone();
  backend->all_reduce(t, NcclOp::Sum)->wait();
  EXPECT_TRUE(torch::equal(t, before));
  torch::Tensor out = torch::zeros({33}, t.options());
  backend->all_gather(t, out)->wait();
  EXPECT_TRUE(torch::equal(out, before));
  torch::Tensor part = torch::zeros({33}, t.options());
  backend->reduce_scatter(t, part)->wait();
  EXPECT_TRUE(torch::equal(part, before));
  torch::Tensor v = torch::zeros({33}, t.options());
  backend->reduce_scatter_v(t, v, {33})->wait();
  EXPECT_TRUE(torch::equal(v, before));
  torch::Tensor g = torch::zeros({33}, t.options());
  backend->all_gather_v(t, g, {33})->wait();
  EXPECT_TRUE(torch::equal(g, before));
  torch::Tensor b = t.to(torch::kBFloat16);
  backend->broadcast(b, 0)->wait();
  EXPECT_TRUE(torch::equal(b, before.to(torch::kBFloat16)));
  torch::Tensor received = torch::zeros({33}, t.options());
  auto sent = backend->send(t, 0);
  auto got = backend->recv(received, 0);
  got->ready();  // polls (and issues the queued pair) without blocking
  got->wait();
  sent->wait();
  EXPECT_TRUE(torch::equal(received, before));
}
