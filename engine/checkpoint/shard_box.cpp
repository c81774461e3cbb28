// engine/checkpoint/shard_box.cpp: see shard_box.h.
#include "engine/checkpoint/shard_box.h"

#include <algorithm>

namespace retort::engine {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Box local_box(const layers::ParamSpec& spec, layers::ShardPosition tp) {
  Box box{std::vector<int64_t>(spec.shape.size(), 0), spec.shape};
  if (spec.shard_dim < 0 || tp.size == 1) return box;
  const int d = spec.shard_dim;
  const int64_t part = spec.padded_shape()[d] / tp.size;
  const int64_t begin = tp.rank * part;
  box.offset[d] = std::min(begin, spec.shape[d]);
  box.shape[d] = std::clamp<int64_t>(spec.shape[d] - begin, 0, part);
  return box;
}

Box intersect(const Box& a, const Box& b) {
  Box out{a.offset, a.shape};
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    out.offset[d] = lo;
    out.shape[d] = std::max<int64_t>(0, hi - lo);
  }
  return out;
}

}  // namespace retort::engine
