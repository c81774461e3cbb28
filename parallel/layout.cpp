// parallel/layout.cpp: see layout.h.
#include "parallel/layout.h"

#include "common/user_error.h"

namespace retort::parallel {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw UserError("invalid parallel layout: " + message);
}

std::string str(int64_t v) {
  return std::to_string(v);
}

}  // namespace

Layout resolve_layout(Layout layout, int world_size, const LayoutDemands& d) {
  require(layout.tensor >= 1, "parallel.tensor=" + str(layout.tensor) + " must be >= 1");
  require(layout.pipeline >= 1, "parallel.pipeline=" + str(layout.pipeline) + " must be >= 1");
  const int model_parallel = layout.tensor * layout.pipeline;
  require(world_size % model_parallel == 0, "world size " + str(world_size) +
                                                " is not divisible by tensor x pipeline = " +
                                                str(layout.tensor) + " x " + str(layout.pipeline));
  const int data = world_size / model_parallel;
  if (layout.data == 0) {
    layout.data = data;
  } else {
    require(layout.data == data, "parallel.data=" + str(layout.data) + " but world size " +
                                     str(world_size) + " / (tensor " + str(layout.tensor) +
                                     " x pipeline " + str(layout.pipeline) + ") = " + str(data));
  }
  const int tp = layout.tensor;
  require(d.heads % tp == 0,
          "model.heads=" + str(d.heads) + " is not divisible by parallel.tensor=" + str(tp));
  // kv heads either split evenly over TP or are replicated when there are fewer than TP.
  require(d.kv_heads % tp == 0 || tp % d.kv_heads == 0,
          "model.kv_heads=" + str(d.kv_heads) + " neither divides nor is divisible by " +
              "parallel.tensor=" + str(tp));
  require(d.ffn_hidden % tp == 0, "model.ffn_hidden=" + str(d.ffn_hidden) +
                                      " is not divisible by parallel.tensor=" + str(tp));
  require(d.layers >= layout.pipeline,
          "model.layers=" + str(d.layers) +
              " is fewer than parallel.pipeline=" + str(layout.pipeline) + " stages");
  if (layout.sequence_parallel) {
    require(d.seq_len % tp == 0, "data.seq_len=" + str(d.seq_len) +
                                     " is not divisible by parallel.tensor=" + str(tp) +
                                     " under parallel.sequence_parallel=true");
  }
  return layout;
}

std::string describe(const Layout& layout) {
  return "TP" + str(layout.tensor) + (layout.sequence_parallel ? " (sequence parallel)" : "") +
         " x PP" + str(layout.pipeline) + " x DP" + str(layout.data);
}

}  // namespace retort::parallel
