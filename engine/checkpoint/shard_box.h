// engine/checkpoint/shard_box.h: which region of a parameter's global (unpadded) tensor a
// rank's local tensor holds, as a box (offset and shape per dimension), and the overlap of two
// boxes. Checkpoints store each rank's pieces with their boxes and assemble any other
// layout's shards from the overlaps, so a save under one layout loads under any other.
#pragma once
#include <cstdint>
#include <vector>

#include "layers/param_spec.h"
#include "layers/parameters.h"

namespace retort::engine {

struct Box {
  std::vector<int64_t> offset, shape;
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
};

// The region of the global tensor held by the local tensor of `spec` at TP position `tp`:
// the whole tensor when replicated; else its slice of the padded shard dimension, cut at the
// real size (a rank holding only vocabulary padding gets an empty box). The local tensor's
// first box.shape[d] entries along the shard dimension are that region.
Box local_box(const layers::ParamSpec& spec, layers::ShardPosition tp);

// The overlap of a and b (empty when they do not meet).
Box intersect(const Box& a, const Box& b);

}  // namespace retort::engine
