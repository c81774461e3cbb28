// parallel/pipeline_partition.cpp: see pipeline_partition.h.
#include "parallel/pipeline_partition.h"

#include <algorithm>

#include "common/user_error.h"

namespace retort::parallel {
namespace {
std::string str(int64_t v) {
  return std::to_string(v);
}
}  // namespace

std::vector<LayerRange> split_layers(int64_t layers, int stages, const std::vector<int64_t>& counts,
                                     const std::string& key) {
  std::vector<int64_t> per_stage = counts;
  if (per_stage.empty()) {
    if (layers < stages)
      throw UserError("model.layers=" + str(layers) + " is fewer than " + str(stages) +
                      " pipeline stages");
    for (int s = 0; s < stages; ++s) per_stage.push_back(layers / stages + (s < layers % stages));
  } else {
    if (int64_t(per_stage.size()) != stages)
      throw UserError(key + " has " + str(per_stage.size()) + " entries but there are " +
                      str(stages) + " pipeline stages");
    int64_t sum = 0;
    for (size_t s = 0; s < per_stage.size(); ++s) {
      if (per_stage[s] < 1)
        throw UserError(key + "[" + str(s) + "]=" + str(per_stage[s]) +
                        ": every stage needs at least one layer");
      sum += per_stage[s];
    }
    if (sum != layers)
      throw UserError(key + " sums to " + str(sum) + " layers but model.layers=" + str(layers));
  }
  std::vector<LayerRange> ranges;
  int64_t first = 0;
  for (int64_t n : per_stage) {
    ranges.push_back({first, first + n});
    first += n;
  }
  return ranges;
}

int stage_of_layer(const std::vector<LayerRange>& ranges, int64_t layer) {
  for (size_t s = 0; s < ranges.size(); ++s)
    if (ranges[s].contains(layer)) return int(s);
  throw UserError("layer " + str(layer) + " is outside the model's " +
                  str(ranges.empty() ? 0 : ranges.back().end) + " layers");
}

std::vector<LayerRange> split_layers_pinned(int64_t layers, int stages,
                                            const std::vector<std::pair<int, int64_t>>& pins) {
  // Boundary b[s] = first layer of stage s (b[0] = 0, b[stages] = layers). A pin (s, l) asks
  // b[s] <= l < b[s+1]. Each boundary gets the even split's value clamped into the window the
  // pins leave it, after the boundary before it.
  std::vector<int64_t> boundary(stages + 1, 0);
  boundary[stages] = layers;
  for (int s = 1; s < stages; ++s) {
    int64_t low = boundary[s - 1], high = layers;
    for (const auto& [stage, layer] : pins) {
      if (stage < s) low = std::max(low, layer + 1);  // layer must stay before stage s
      if (stage >= s) high = std::min(high, layer);   // layer must not fall before stage s
    }
    const int64_t even = (layers * s + stages - 1) / stages;
    if (low > high) {
      std::string which;
      for (const auto& [stage, layer] : pins)
        which += " (layer " + str(layer) + " on stage " + str(stage) + ")";
      throw UserError("the teacher's layers cannot be split over " + str(stages) +
                      " pipeline stages so that each distillation pair stays on one stage; "
                      "pairs ask for:" +
                      which +
                      ". Pair student and teacher layers in the same order, or change "
                      "parallel.pipeline_split");
    }
    boundary[s] = std::clamp(even, low, high);
  }
  for (const auto& [stage, layer] : pins)
    if (layer < boundary[stage] || layer >= boundary[stage + 1])
      throw UserError("teacher layer " + str(layer) + " cannot be placed on pipeline stage " +
                      str(stage));
  std::vector<LayerRange> ranges;
  for (int s = 0; s < stages; ++s) ranges.push_back({boundary[s], boundary[s + 1]});
  return ranges;
}

}  // namespace retort::parallel
