// tests/unit/layout_test.cpp: every layout that cannot work is refused before any work
// starts, with the numbers at fault named; valid layouts resolve parallel.data=auto; the mesh's
// named axes place every rank in the groups the rank formula (pp * DP + dp) * TP + tp implies.
#include "parallel/layout.h"

#include <gtest/gtest.h>

#include "common/user_error.h"
#include "parallel/mesh_axes.h"

using namespace retort;
using namespace retort::parallel;

namespace {

std::string refusal(Layout layout, int world, LayoutDemands demands) {
  try {
    resolve_layout(layout, world, demands);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

const LayoutDemands kModel{8, 2, 128, 4, 32};  // heads, kv_heads, ffn, layers, seq

}  // namespace

TEST(Layout, ResolvesAutoDataParallel) {
  Layout l = resolve_layout({2, 2, 0, true}, 8, kModel);
  EXPECT_EQ(l.data, 2);
  EXPECT_EQ(describe(l), "TP2 (sequence parallel) x PP2 x DP2");
  EXPECT_EQ(resolve_layout({4, 1, 0, false}, 4, kModel).data, 1);  // kv heads replicated
}

TEST(Layout, RefusesImpossibleLayouts) {
  EXPECT_NE(refusal({3, 1, 0, false}, 8, kModel)
                .find("world size 8 is not divisible by tensor x pipeline = 3 x 1"),
            std::string::npos);
  EXPECT_NE(refusal({2, 1, 3, false}, 8, kModel).find("parallel.data=3 but world size 8"),
            std::string::npos);
  LayoutDemands odd_heads = kModel;
  odd_heads.heads = 6;
  EXPECT_NE(refusal({4, 1, 0, false}, 4, odd_heads)
                .find("model.heads=6 is not divisible by parallel.tensor=4"),
            std::string::npos);
  LayoutDemands kv3 = kModel;
  kv3.kv_heads = 3;
  kv3.heads = 12;
  EXPECT_NE(refusal({2, 1, 0, false}, 2, kv3).find("model.kv_heads=3"), std::string::npos);
  LayoutDemands ffn = kModel;
  ffn.ffn_hidden = 130;
  EXPECT_NE(refusal({4, 1, 0, false}, 4, ffn).find("model.ffn_hidden=130"), std::string::npos);
  EXPECT_NE(
      refusal({1, 8, 0, false}, 8, kModel).find("model.layers=4 is fewer than parallel.pipeline=8"),
      std::string::npos);
  LayoutDemands seq = kModel;
  seq.seq_len = 30;
  EXPECT_NE(refusal({4, 1, 0, true}, 4, seq).find("data.seq_len=30 is not divisible"),
            std::string::npos);
  EXPECT_EQ(refusal({4, 1, 0, false}, 4, seq), "");  // fine without sequence parallel
}

// Every group along named axes, for every rank of several layouts, against the color and key
// written out by hand from the coordinates: the members of a group share every other axis and
// are numbered along theirs.
TEST(MeshAxes, GroupsAlongNamedAxesMatchTheCoordinates) {
  for (const Layout& layout : {Layout{2, 3, 2, false}, Layout{4, 1, 2, false},
                               Layout{1, 2, 3, false}, Layout{3, 2, 1, false}}) {
    const int T = layout.tensor, P = layout.pipeline, D = layout.data;
    for (int rank = 0; rank < T * P * D; ++rank) {
      const MeshCoordinates c = coordinates_of(rank, layout);
      EXPECT_EQ(rank, (c.pp * D + c.dp) * T + c.tp);
      const GroupPlace tp = group_place(rank, layout, {MeshAxis::tensor});
      EXPECT_EQ(tp.color, c.pp * D + c.dp);
      EXPECT_EQ(tp.key, c.tp);
      const GroupPlace dp = group_place(rank, layout, {MeshAxis::data});
      EXPECT_EQ(dp.color, c.pp * T + c.tp);
      EXPECT_EQ(dp.key, c.dp);
      const GroupPlace pp = group_place(rank, layout, {MeshAxis::pipeline});
      EXPECT_EQ(pp.color, c.dp * T + c.tp);
      EXPECT_EQ(pp.key, c.pp);
      const GroupPlace mp = group_place(rank, layout, {MeshAxis::pipeline, MeshAxis::tensor});
      EXPECT_EQ(mp.color, c.dp);
      EXPECT_EQ(mp.key, c.pp * T + c.tp);
      const GroupPlace all =
          group_place(rank, layout, {MeshAxis::pipeline, MeshAxis::data, MeshAxis::tensor});
      EXPECT_EQ(all.color, 0);
      EXPECT_EQ(all.key, rank);
    }
  }
}
