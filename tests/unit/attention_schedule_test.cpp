// tests/unit/attention_schedule_test.cpp: the attention kernels' work items
// (kernels/attention_kernels.h) give the same bits whatever thread takes which item and when.
// The reference runs every item on one thread in index order; the adversarial schedule gives
// one thread all of the first key tile's items, started late, and another thread every other
// item at once, so each later tile reaches its query blocks before their running state
// (online softmax, dQ) exists and must wait its turn. Shapes: several query blocks and key
// tiles, grouped query heads, a window, fp32 (tile products) and fp64 (BLAS).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/attention_kernels.h"

namespace retort::kernels {
namespace {

struct Layout {
  int64_t heads, kv_heads, s, d, window, block_rows, key_tile;
};

// Every input, output and gradient of one forward and backward, rows laid out [s, heads, d].
template <typename T>
struct Run {
  std::vector<T> q, k, v, d_out, out, lse, dq, dk, dv;
};

template <typename T>
Run<T> inputs(const Layout& l) {
  std::mt19937 gen(11);
  std::normal_distribution<double> normal(0.0, 1.5);
  auto filled = [&](int64_t n) {
    std::vector<T> x(n);
    for (T& value : x) value = T(normal(gen));
    return x;
  };
  Run<T> run;
  run.q = filled(l.s * l.heads * l.d);
  run.k = filled(l.s * l.kv_heads * l.d);
  run.v = filled(l.s * l.kv_heads * l.d);
  run.d_out = filled(l.s * l.heads * l.d);
  run.out.assign(run.q.size(), T(0));
  run.dq.assign(run.q.size(), T(0));
  run.lse.assign(l.heads * l.s, T(0));
  run.dk.assign(run.k.size(), T(0));
  run.dv.assign(run.k.size(), T(0));
  return run;
}

template <typename T>
HeadRows<T> rows_of(std::vector<std::remove_const_t<T>>& x, int64_t heads, int64_t d) {
  return {x.data(), 0, d, heads * d};
}

// Runs the forward's items, then the backward's, each given to threads by `order`: for each
// thread, the item indices it takes in turn (item i: tile i / units of unit i % units).
using Plan = std::vector<std::vector<int64_t>>;
using Planner = Plan (*)(int64_t units, int64_t tiles);

template <typename T>
void run_items(const Layout& l, Run<T>& run, Planner order, const std::vector<int64_t>& delay_ms) {
  const AttentionShape sh{l.s,
                          l.d,
                          l.heads / l.kv_heads,
                          l.window,
                          l.block_rows,
                          std::min(l.key_tile, l.s),
                          1.0 / std::sqrt(double(l.d))};
  const int64_t tiles = attention_key_tiles(sh), blocks = attention_query_blocks(sh);
  const int64_t group = sh.group;
  auto phase = [&](bool backward) {
    const int64_t units = backward ? l.kv_heads : l.heads;
    const int64_t state_size =
        backward ? attention_backward_state(sh) : attention_forward_state(sh);
    const int64_t blocks_per_unit = backward ? group * blocks : blocks;
    std::vector<T> state(units * state_size);
    std::vector<int32_t> done(units * blocks_per_unit, 0);
    const auto plan = order(units, tiles);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < plan.size(); ++t)
      threads.emplace_back([&, t] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms[t]));
        std::vector<T> workspace(attention_workspace(sh));
        for (int64_t i : plan[t]) {
          const int64_t unit = i % units, tile = i / units;
          HeadRows<const T> q = rows_of<const T>(run.q, l.heads, l.d);
          HeadRows<const T> k = rows_of<const T>(run.k, l.kv_heads, l.d);
          HeadRows<const T> v = rows_of<const T>(run.v, l.kv_heads, l.d);
          if (!backward) {
            attention_forward_tile(sh, q, k, v, rows_of<T>(run.out, l.heads, l.d),
                                   run.lse.data() + unit * l.s, 0, unit, tile,
                                   state.data() + unit * state_size,
                                   done.data() + unit * blocks_per_unit, workspace.data());
          } else {
            attention_backward_tile(sh, q, k, v, rows_of<const T>(run.out, l.heads, l.d),
                                    rows_of<const T>(run.d_out, l.heads, l.d), run.lse.data(),
                                    rows_of<T>(run.dq, l.heads, l.d),
                                    rows_of<T>(run.dk, l.kv_heads, l.d),
                                    rows_of<T>(run.dv, l.kv_heads, l.d), 0, unit, tile,
                                    state.data() + unit * state_size,
                                    done.data() + unit * blocks_per_unit, workspace.data());
          }
        }
      });
    for (std::thread& thread : threads) thread.join();
  };
  phase(false);
  phase(true);
}

// One thread, items in index order.
Plan in_order(int64_t units, int64_t tiles) {
  std::vector<int64_t> all(units * tiles);
  for (int64_t i = 0; i < units * tiles; ++i) all[i] = i;
  return {all};
}

// Thread 0: the first key tile of every unit; thread 1: all the others, in index order.
Plan first_tile_apart(int64_t units, int64_t tiles) {
  Plan plan(2);
  for (int64_t i = 0; i < units * tiles; ++i) plan[i < units ? 0 : 1].push_back(i);
  return plan;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
void check_schedule_independent(const Layout& l) {
  SCOPED_TRACE(::testing::Message() << "heads " << l.heads << "/" << l.kv_heads << " s " << l.s
                                    << " d " << l.d << " window " << l.window << " blocks "
                                    << l.block_rows << "x" << l.key_tile << " bytes " << sizeof(T));
  // The BLAS libtorch loads (this test runs in the torch suite for it) does fp64 and the
  // tile products' edges.
  ASSERT_TRUE(attention_blas_available());
  Run<T> reference = inputs<T>(l), adversarial = inputs<T>(l);
  run_items(l, reference, in_order, {0});
  // The first tile's thread starts 30 ms late: the other reaches every block first.
  run_items(l, adversarial, first_tile_apart, {30, 0});
  ASSERT_GT(attention_key_tiles({l.s, l.d, 1, l.window, l.block_rows, l.key_tile, 1.0}), 1);
  EXPECT_TRUE(same_bits(adversarial.out, reference.out));
  EXPECT_TRUE(same_bits(adversarial.lse, reference.lse));
  EXPECT_TRUE(same_bits(adversarial.dq, reference.dq));
  EXPECT_TRUE(same_bits(adversarial.dk, reference.dk));
  EXPECT_TRUE(same_bits(adversarial.dv, reference.dv));
  // And the results are real: an output row is a convex mix of value rows, so nonzero here.
  double total = 0;
  for (T x : reference.out) total += std::abs(double(x));
  EXPECT_GT(total, 0.0);
}

TEST(AttentionSchedule, SameBitsWhateverThreadTakesEachTile) {
  for (int64_t window : {int64_t(0), int64_t(45)}) {
    const Layout l{4, 2, 100, 32, window, 24, 32};  // 5 query blocks, 4 key tiles, GQA
    check_schedule_independent<float>(l);
    check_schedule_independent<double>(l);
  }
}

}  // namespace
}  // namespace retort::kernels
