// parallel/pipeline_partition.h: which contiguous range of layers each pipeline stage runs.
// The student's split is even (the first layers % stages stages take one layer more) or
// given explicitly (parallel.pipeline_split). A teacher's split is derived from the student's
// so that every distillation pair (student layer, teacher layer) lands on one stage: the
// teacher's hidden state travels the pipeline next to the student's, so a teacher capture
// exists only on the stage that runs its layer. Plain C++.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace retort::parallel {

struct LayerRange {
  int64_t first = 0, end = 0;  // layers [first, end)
  int64_t size() const { return end - first; }
  bool contains(int64_t layer) const { return layer >= first && layer < end; }
};

// One range per stage. `counts` empty = even split; otherwise layers per stage, which must
// number `stages`, each at least 1, summing to `layers` (UserError naming `key` if not).
std::vector<LayerRange> split_layers(int64_t layers, int stages,
                                     const std::vector<int64_t>& counts = {},
                                     const std::string& key = "parallel.pipeline_split");

// The stage whose range holds `layer`.
int stage_of_layer(const std::vector<LayerRange>& ranges, int64_t layer);

// A split of `layers` over `stages` (stages may be empty) as close to even as allowed by the
// pins: each pin (stage, layer) requires that `layer` runs on `stage`. Throws UserError naming
// the pins that cannot be met together.
std::vector<LayerRange> split_layers_pinned(int64_t layers, int stages,
                                            const std::vector<std::pair<int, int64_t>>& pins);

}  // namespace retort::parallel
