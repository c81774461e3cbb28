// tests/mpi/primitives_test.cpp: each communication primitive's forward and backward
// against its definition, on the world group; plus the Communicator's collectives, async
// handles and counters, and the mesh's group arithmetic.
#include "parallel/primitives.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallel/mesh.h"
#include "world_group.h"

using namespace retort::parallel;

namespace {

struct Group {
  Communicator comm{dup_world(), "test"};
  int r = comm.rank(), n = comm.size();
  double rank_sum() const { return n * (n + 1) / 2.0; }  // sum of (rank + 1)
};

// The same tensor on every rank.
torch::Tensor shared_random(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kDouble);
}

torch::Tensor chunk(const torch::Tensor& t, int64_t dim, const Group& g) {
  return t.chunk(g.n, dim)[g.r];
}

// Runs y = f(x) and y.backward(gy); returns {y, dx}.
template <typename F>
std::pair<torch::Tensor, torch::Tensor> run(F f, torch::Tensor x, const torch::Tensor& gy) {
  x = x.detach().clone().requires_grad_(true);
  torch::Tensor y = f(x);
  y.backward(gy);
  return {y.detach(), x.grad()};
}

}  // namespace

TEST(Primitives, CopyToTp) {
  Group g;
  torch::Tensor X = shared_random({2, 4, 6}, 1), G = shared_random({2, 4, 6}, 2);
  auto [y, dx] = run([&](auto x) { return copy_to_tp(x, g.comm); }, X, G * (g.r + 1));
  EXPECT_TRUE(torch::equal(y, X));
  EXPECT_TRUE(torch::allclose(dx, G * g.rank_sum()));
}

TEST(Primitives, ReduceFromTp) {
  Group g;
  torch::Tensor X = shared_random({2, 4, 6}, 3), G = shared_random({2, 4, 6}, 4);
  auto [y, dx] = run([&](auto x) { return reduce_from_tp(x, g.comm); }, X * (g.r + 1), G);
  EXPECT_TRUE(torch::allclose(y, X * g.rank_sum()));
  EXPECT_TRUE(torch::equal(dx, G));
}

TEST(Primitives, ScatterToTp) {
  Group g;
  torch::Tensor X = shared_random({2, 4, 3 * g.n}, 5), G = shared_random({2, 4, 3 * g.n}, 6);
  auto [y, dx] = run([&](auto x) { return scatter_to_tp(x, g.comm); }, X, chunk(G, 2, g));
  EXPECT_TRUE(torch::equal(y, chunk(X, 2, g)));
  EXPECT_TRUE(torch::equal(dx, G));
}

TEST(Primitives, GatherFromTp) {
  Group g;
  torch::Tensor X = shared_random({2, 4, 3 * g.n}, 7), G = shared_random({2, 4, 3 * g.n}, 8);
  auto [y, dx] = run([&](auto x) { return gather_from_tp(x, g.comm); }, chunk(X, 2, g), G);
  EXPECT_TRUE(torch::equal(y, X));
  EXPECT_TRUE(torch::equal(dx, chunk(G, 2, g)));
}

TEST(Primitives, ScatterToSp) {
  Group g;
  torch::Tensor X = shared_random({2, 2 * g.n, 5}, 9), G = shared_random({2, 2 * g.n, 5}, 10);
  auto [y, dx] = run([&](auto x) { return scatter_to_sp(x, g.comm); }, X, chunk(G, 1, g));
  EXPECT_TRUE(torch::equal(y, chunk(X, 1, g)));
  EXPECT_TRUE(torch::equal(dx, G));
}

TEST(Primitives, GatherFromSp) {
  Group g;
  torch::Tensor X = shared_random({2, 2 * g.n, 5}, 11), G = shared_random({2, 2 * g.n, 5}, 12);
  auto [y, dx] =
      run([&](auto x) { return gather_from_sp(x, g.comm); }, chunk(X, 1, g), G * (g.r + 1));
  EXPECT_TRUE(torch::equal(y, X));
  EXPECT_TRUE(torch::allclose(dx, chunk(G * g.rank_sum(), 1, g)));
}

TEST(Primitives, ReduceScatterToSp) {
  Group g;
  torch::Tensor X = shared_random({2, 2 * g.n, 5}, 13), G = shared_random({2, 2 * g.n, 5}, 14);
  auto [y, dx] =
      run([&](auto x) { return reduce_scatter_to_sp(x, g.comm); }, X * (g.r + 1), chunk(G, 1, g));
  EXPECT_TRUE(torch::allclose(y, chunk(X * g.rank_sum(), 1, g)));
  EXPECT_TRUE(torch::equal(dx, G));
}

TEST(Communicator, CollectivesAsyncAndCounters) {
  Group g;
  torch::Tensor t = torch::full({5}, double(g.r + 1), torch::kDouble);
  Handle h = g.comm.all_reduce_async(t);
  h.wait();
  EXPECT_TRUE(torch::allclose(t, torch::full({5}, g.rank_sum(), torch::kDouble)));
  torch::Tensor m = torch::full({1}, double(g.r), torch::kDouble);
  g.comm.all_reduce(m, ReduceOp::Max);
  EXPECT_EQ(m.item<double>(), g.n - 1);
  torch::Tensor b = torch::full({3}, double(g.r), torch::kFloat);
  g.comm.broadcast(b, g.n - 1);
  EXPECT_EQ(b[0].item<float>(), float(g.n - 1));
  // Ring send/recv.
  torch::Tensor out = torch::full({4}, float(g.r), torch::kFloat), in = torch::empty({4});
  Handle s = g.comm.send_async(out, (g.r + 1) % g.n, 7);
  g.comm.recv(in, (g.r + g.n - 1) % g.n, 7);
  s.wait();
  EXPECT_EQ(in[0].item<float>(), float((g.r + g.n - 1) % g.n));
  const auto& c = g.comm.counters();
  EXPECT_EQ(c.at("all_reduce").calls, 2);
  EXPECT_EQ(c.at("all_reduce").bytes, 5 * 8 + 8);
  EXPECT_EQ(c.at("broadcast").bytes, 12);
  EXPECT_EQ(c.at("send").bytes, 16);
}

// bfloat16 tensors are reduced in float32 and rounded once (parallel/communicator.h): each
// rank's values, different per rank, summed in float64 and rounded to bfloat16 once is the
// result bit for bit, for all_reduce (also in pieces), reduce_scatter and reduce_scatter_v.
// Magnitudes within [0.01, 10] keep the float32 sum of up to 8 bfloat16 values exact, so the
// float64 reference is the float32 one. A sum rounded to bfloat16 at every step (or the bits
// summed as integers) differs. bfloat16 moves unchanged through all_gather, broadcast and
// send/recv, and reductions count the float32 bytes they move.
TEST(Communicator, BFloat16SumsAreFloat32SumsRoundedOnce) {
  Group g;
  const int64_t n = 64 * g.n;
  torch::manual_seed(21);
  torch::Tensor magnitude = torch::rand({g.n, n}, torch::kDouble) * 3 - 2;  // 10^[-2, 1)
  torch::Tensor sign = torch::randint(2, {g.n, n}, torch::kDouble) * 2 - 1;
  torch::Tensor every_rank = (torch::pow(10.0, magnitude) * sign).to(torch::kBFloat16);
  torch::Tensor mine = every_rank[g.r].contiguous();
  torch::Tensor expected = every_rank.to(torch::kDouble).sum(0).to(torch::kBFloat16);

  torch::Tensor reduced = mine.clone();
  g.comm.all_reduce(reduced);
  EXPECT_TRUE(torch::equal(reduced, expected));
  EXPECT_EQ(g.comm.counters().at("all_reduce").bytes, n * 4);

  const int64_t one_call = Communicator::max_elements_per_call();
  Communicator::set_max_elements_per_call(7);
  torch::Tensor in_pieces = mine.clone();
  g.comm.all_reduce(in_pieces);
  torch::Tensor part = torch::empty({n / g.n}, torch::kBFloat16);
  g.comm.reduce_scatter_flat_async(mine, part).wait();
  Communicator::set_max_elements_per_call(one_call);
  EXPECT_TRUE(torch::equal(in_pieces, expected));
  EXPECT_TRUE(torch::equal(part, expected.chunk(g.n)[g.r]));

  torch::Tensor scattered = g.comm.reduce_scatter(mine, 0);
  EXPECT_TRUE(torch::equal(scattered, expected.chunk(g.n)[g.r]));
  std::vector<int64_t> counts(g.n, 64);
  counts[0] += 5;
  counts[g.n - 1] -= 5;
  torch::Tensor uneven = torch::empty({counts[g.r]}, torch::kBFloat16);
  g.comm.reduce_scatter_v_async(mine, uneven, counts).wait();
  int64_t offset = 0;
  for (int rank = 0; rank < g.r; ++rank) offset += counts[rank];
  EXPECT_TRUE(torch::equal(uneven, expected.narrow(0, offset, counts[g.r])));

  torch::Tensor gathered = g.comm.all_gather(mine.view({1, n}), 0);
  EXPECT_TRUE(torch::equal(gathered, every_rank));
  torch::Tensor from_last = mine.clone();
  g.comm.broadcast(from_last, g.n - 1);
  EXPECT_TRUE(torch::equal(from_last, every_rank[g.n - 1]));
  torch::Tensor received = torch::empty({n}, torch::kBFloat16);
  Handle sent = g.comm.send_async(mine, (g.r + 1) % g.n, 9);
  g.comm.recv(received, (g.r + g.n - 1) % g.n, 9);
  sent.wait();
  EXPECT_TRUE(torch::equal(received, every_rank[(g.r + g.n - 1) % g.n]));
}

// ReduceOp::SumNarrow (parallel.dp_reduce_dtype=bfloat16): bf16 moves and is summed as bf16,
// half the bytes of the widened sum, and every partial sum is rounded: each of the n - 1
// additions errs by at most u = 2^-8 of its result, whose magnitude is at most the sum of the
// |values|, so |result - exact| <= (n - 1) u sum|x|. Two ranks round once: exactly the
// float64 sum rounded. All ranks get the same bits (the operation is commutative).
TEST(Communicator, NarrowBFloat16SumsMoveHalfTheBytesAndRoundEachPartialSum) {
  Group g;
  const int64_t n = 64 * g.n;
  torch::manual_seed(22);
  torch::Tensor every_rank = torch::randn({g.n, n}, torch::kDouble).to(torch::kBFloat16);
  torch::Tensor mine = every_rank[g.r].contiguous();
  torch::Tensor exact = every_rank.to(torch::kDouble).sum(0);
  torch::Tensor bound = every_rank.to(torch::kDouble).abs().sum(0) * (g.n - 1) / 256.0;
  g.comm.reset_counters();
  torch::Tensor reduced = mine.clone();
  g.comm.all_reduce(reduced, ReduceOp::SumNarrow);
  EXPECT_EQ(g.comm.counters().at("all_reduce").bytes, n * 2);
  EXPECT_TRUE(((reduced.to(torch::kDouble) - exact).abs() <= bound).all().item<bool>())
      << "worst error " << (reduced.to(torch::kDouble) - exact).abs().max().item<double>();
  if (g.n == 2) EXPECT_TRUE(torch::equal(reduced, exact.to(torch::kBFloat16)));
  torch::Tensor first = reduced.clone();
  g.comm.broadcast(first, 0);
  EXPECT_TRUE(torch::equal(first, reduced)) << "ranks disagree";

  std::vector<int64_t> counts(g.n, 64);
  torch::Tensor part = torch::empty({64}, torch::kBFloat16);
  g.comm.reset_counters();
  g.comm.reduce_scatter_v_async(mine, part, counts, ReduceOp::SumNarrow).wait();
  EXPECT_EQ(g.comm.counters().at("reduce_scatter").bytes, n * 2);
  torch::Tensor my_exact = exact.narrow(0, 64 * g.r, 64), my_bound = bound.narrow(0, 64 * g.r, 64);
  EXPECT_TRUE(((part.to(torch::kDouble) - my_exact).abs() <= my_bound).all().item<bool>());
}

// Tensor-parallel sums of bf16 activations and of their gradients travel and add in bf16
// (parallel/primitives.cpp, ReduceOp::SumNarrow): 2 bytes an element where float32 sums moved
// 4, each partial sum rounded: within (n - 1) u sum|x| of the float64 sum (u = 2^-8), and on
// two ranks exactly the float64 sum rounded once.
TEST(Primitives, BFloat16ActivationSumsTravelInBFloat16) {
  Group g;
  torch::Tensor every_rank = shared_random({g.n, 2, 2 * g.n, 8}, 30).to(torch::kBFloat16);
  torch::Tensor mine = every_rank[g.r].contiguous();
  torch::Tensor exact = every_rank.to(torch::kDouble).sum(0);
  torch::Tensor bound = every_rank.to(torch::kDouble).abs().sum(0) * (g.n - 1) / 256.0;
  auto holds = [&](const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& b) {
    EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(((got.to(torch::kDouble) - want).abs() <= b).all().item<bool>())
        << "worst error " << (got.to(torch::kDouble) - want).abs().max().item<double>();
    if (g.n == 2) EXPECT_TRUE(torch::equal(got, want.to(torch::kBFloat16)));
  };
  auto bytes = [&](const char* op) {
    auto it = g.comm.counters().find(op);
    return it == g.comm.counters().end() ? int64_t(0) : it->second.bytes;
  };
  const int64_t elements = mine.numel();
  g.comm.reset_counters();
  auto [summed, unused] = run([&](auto x) { return reduce_from_tp(x, g.comm); }, mine, mine);
  holds(summed, exact, bound);
  auto [same, dx] = run([&](auto x) { return copy_to_tp(x, g.comm); }, mine, mine);
  holds(dx, exact, bound);
  EXPECT_EQ(bytes("all_reduce"), 2 * elements * 2) << "two sums of bf16, 2 bytes an element";
  g.comm.reset_counters();
  auto [part, unused2] = run([&](auto x) { return reduce_scatter_to_sp(x, g.comm); }, mine,
                             chunk(mine, 1, g).contiguous());
  holds(part, chunk(exact, 1, g), chunk(bound, 1, g));
  auto [gathered, dpart] =
      run([&](auto x) { return gather_from_sp(x, g.comm); }, chunk(mine, 1, g).contiguous(), mine);
  holds(dpart, chunk(exact, 1, g), chunk(bound, 1, g));
  EXPECT_EQ(bytes("reduce_scatter"), 2 * elements * 2);
}

// Every collective and point-to-point call gives the same result when its message goes out
// in pieces of at most 7 elements (MPI's int counts, exercised small) as in one call, and
// the results match their definitions computed here.
TEST(Communicator, SplitsMessagesLargerThanThePieceLimit) {
  Group g;
  const int64_t one_call = Communicator::max_elements_per_call();
  auto run_all = [&] {
    std::vector<torch::Tensor> results;
    torch::Tensor reduced = shared_random({50}, 11) * (g.r + 1);
    g.comm.all_reduce_async(reduced).wait();
    results.push_back(reduced);
    results.push_back(g.comm.all_gather(shared_random({2, 11}, 12 + g.r), 1));
    results.push_back(g.comm.reduce_scatter(shared_random({13 * g.n, 2}, 20 + g.r), 0));
    std::vector<int64_t> counts;  // uneven: 5, 8, 11, ... elements per rank
    for (int r = 0; r < g.n; ++r) counts.push_back(5 + 3 * r);
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    torch::Tensor in = shared_random({total}, 30 + g.r),
                  part = torch::empty({counts[g.r]}, torch::kDouble);
    g.comm.reduce_scatter_v_async(in, part, counts).wait();
    results.push_back(part);
    torch::Tensor gathered = torch::empty({total}, torch::kDouble);
    g.comm.all_gather_v_async(shared_random({counts[g.r]}, 40 + g.r), gathered, counts).wait();
    results.push_back(gathered);
    torch::Tensor b = shared_random({23}, 50 + g.r);
    g.comm.broadcast(b, g.n - 1);
    results.push_back(b);
    torch::Tensor out = shared_random({19}, 60 + g.r), got = torch::empty({19}, torch::kDouble);
    Handle s = g.comm.send_async(out, (g.r + 1) % g.n, 9);
    g.comm.recv_async(got, (g.r + g.n - 1) % g.n, 9).wait();
    s.wait();
    results.push_back(got);
    return results;
  };
  const std::vector<torch::Tensor> whole = run_all();
  Communicator::set_max_elements_per_call(7);
  const std::vector<torch::Tensor> pieces = run_all();
  Communicator::set_max_elements_per_call(one_call);
  ASSERT_EQ(whole.size(), pieces.size());
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_TRUE(torch::allclose(whole[i], pieces[i], 1e-14, 1e-14)) << "operation " << i;
  // And the definitions: a sum over ranks, a concatenation, a received ring neighbour.
  torch::Tensor sum = torch::zeros({50}, torch::kDouble);
  for (int r = 0; r < g.n; ++r) sum += shared_random({50}, 11) * (r + 1);
  EXPECT_TRUE(torch::allclose(pieces[0], sum, 1e-14, 1e-14));
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < g.n; ++r) parts.push_back(shared_random({2, 11}, 12 + r));
  EXPECT_TRUE(torch::equal(pieces[1], torch::cat(parts, 1)));
  torch::Tensor expected_part = torch::zeros({13, 2}, torch::kDouble);
  for (int r = 0; r < g.n; ++r)
    expected_part += shared_random({13 * g.n, 2}, 20 + r).narrow(0, 13 * g.r, 13);
  EXPECT_TRUE(torch::allclose(pieces[2], expected_part, 1e-14, 1e-14));
  EXPECT_TRUE(torch::equal(pieces[5], shared_random({23}, 50 + g.n - 1)));
  EXPECT_TRUE(torch::equal(pieces[6], shared_random({19}, 60 + (g.r + g.n - 1) % g.n)));
}

TEST(Mesh, GroupsFollowTheLayout) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % 2 != 0) GTEST_SKIP() << "needs an even world";
  Layout layout = resolve_layout({2, 1, 0, false}, world, {4, 2, 8, 2, 8});
  Mesh mesh(layout);
  const auto c = mesh.coordinates();
  EXPECT_EQ(mesh.tp().size(), 2);
  EXPECT_EQ(mesh.gradient_reduction().size(), world / 2);
  EXPECT_EQ(mesh.tp().rank(), c.tp);
  EXPECT_EQ(mesh.gradient_reduction().rank(), c.dp);
  EXPECT_EQ(mesh.data_split().index, c.dp);
  EXPECT_EQ(mesh.data_split().count, world / 2);
  EXPECT_EQ(c.tp, mesh.world_rank() % 2);  // TP is fastest-varying
  // Each rank learns its TP partner's world rank: neighbours share a TP group.
  torch::Tensor ranks = torch::full({1}, int64_t(mesh.world_rank()), torch::kLong);
  torch::Tensor all = mesh.tp().all_gather(ranks, 0);
  EXPECT_EQ(all[0].item<int64_t>() + 1, all[1].item<int64_t>());
  EXPECT_EQ(all[0].item<int64_t>() % 2, 0);
}
