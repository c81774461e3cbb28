// bench/products_floor.h: the time one training step's matrix products take alone, at the
// model's own shapes, run back to back through the BLAS torch calls (outputs allocated once,
// nothing else in between): a floor no engine driving that BLAS can go below, so the
// tokens/s it allows is the most any such engine can reach with this model on this machine.
#pragma once
#include <cstdint>

#include "layers/model_config.h"

namespace retort::bench {

struct ProductsFloor {
  double seconds = 0;  // one step's products, best of the repeats
  double gflop = 0;    // their FLOPs
};

// One process, no tensor parallelism: per micro-batch of `tokens` tokens, each decoder layer's
// q|k|v, output, gate|up and down products and the LM head in chunks of `head_chunk_tokens`
// tokens, each forward (x W^T), input gradient (dY W) and weight gradient (dW += dY^T x);
// `micro_batches` micro-batches per step; best of `repeats` after one warm-up.
ProductsFloor measure_products_floor(const layers::ModelConfig& model, int64_t tokens,
                                     int64_t head_chunk_tokens, int64_t micro_batches,
                                     int repeats = 3);

}  // namespace retort::bench
