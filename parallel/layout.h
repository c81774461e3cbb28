// parallel/layout.h: the parallel layout (tensor x pipeline x data, sequence parallel) and
// the checks that refuse a layout that cannot work, before any work starts. The checks take
// plain numbers (heads, layers, ...) so parallel/ stays free of any model type.
#pragma once
#include <cstdint>
#include <string>

namespace retort::parallel {

struct Layout {
  int tensor = 1;
  int pipeline = 1;
  int data = 0;  // 0 = auto: world / (tensor * pipeline)
  bool sequence_parallel = false;
};

// What a model asks of a layout: each number must split evenly where the layout splits it.
struct LayoutDemands {
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t ffn_hidden = 1;
  int64_t layers = 1;
  int64_t seq_len = 1;
};

// Returns the layout with data filled in; throws UserError naming the numbers at fault.
Layout resolve_layout(Layout layout, int world_size, const LayoutDemands& demands);

std::string describe(const Layout& layout);

}  // namespace retort::parallel
