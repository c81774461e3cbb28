// kernels/attention_kernels.h: the causal (optionally sliding-window) attention of
// blocked_attention.h as fused CPU loops over one (head, key tile) at a time. A block of query
// rows meets the keys it can see in tiles; each tile's scores are formed by one BLAS product
// into a small workspace that stays in cache, turned into probabilities in one pass (online
// softmax in forward, the saved log-sum-exp in backward) and used by the next product at once,
// so no element-wise pass goes through memory. Backward is FlashAttention-2's: scores formed
// again, dV, dP, dS, dQ and dK per tile; dK and dV of a key tile accumulated in cache over the
// query blocks, dQ of a block carried from tile to tile. On the diagonal a tile's rows go in
// groups of 32, each formed only up to its own last key. On a tile every row of the block sees
// whole, the forward's row maxima come out of the score product's registers
// (tile_gemm_row_max), so its online softmax is one pass over the tile.
// No torch here: the caller (layers/blocked_attention.cpp) hands the items to its threads, one
// BLAS thread each. fp32 products run as kernels/tile_gemm.h on AVX-512 CPUs (the tile's K^T,
// V, V^T and K packed into panels once per item, Q and dO once per query block); fp64 and
// fp32 elsewhere call the BLAS library already loaded with libtorch (sgemm_,
// dgemm_), looked up at run time. Key tiles lie on a grid of key_tile keys; a block's
// first visible key is rounded down to a 32-key boundary (keys before a window's start get
// probability 0), so a tile's K^T is whole panels when key_tile is a multiple of 32.
#pragma once
#include <cstdint>

namespace retort::kernels {

// Rows of d contiguous values: element (batch, head, row, 0) at
// data + batch * batch_stride + head * head_stride + row * row_stride.
template <typename T>
struct HeadRows {
  T* data;
  int64_t batch_stride, head_stride, row_stride;
  T* at(int64_t batch, int64_t head, int64_t row) const {
    return data + batch * batch_stride + head * head_stride + row * row_stride;
  }
};

struct AttentionShape {
  int64_t s, d;
  int64_t group;   // query heads per key/value head (consecutive query heads share one)
  int64_t window;  // 0: causal only
  int64_t block_rows, key_tile;
  double scale;  // 1 / sqrt(d)
};

// Whether the BLAS library offers sgemm_ and dgemm_ in this process.
bool attention_blas_available();

// The work of one call is cut into items, one per (batch, head, key tile) in forward and per
// (batch, key/value head, key tile) in backward, which the caller hands out to its threads in
// any order that takes a head's tiles in order (e.g. tile-major: index / (batch x heads) is
// the tile). A query block meets its key tiles in order whichever thread holds them: its
// running state (the online softmax in forward, dQ in backward) lives in `state`, shared by
// the call, and `done` ([query blocks] per head, zeroed before the call) counts its tiles
// finished; an item waits for its turn at a block. So results do not depend on the schedule,
// and the threads share the work to within a tile of one block.
int64_t attention_key_tiles(const AttentionShape& shape);
int64_t attention_query_blocks(const AttentionShape& shape);

// State elements per (batch, head) in forward and per (batch, key/value head) in backward.
int64_t attention_forward_state(const AttentionShape& shape);
int64_t attention_backward_state(const AttentionShape& shape);

// Workspace elements a thread needs for either function below.
int64_t attention_workspace(const AttentionShape& shape);

// Key tile `tile` of query head `head` of batch `batch`. When its last tile is done, a query
// row's output and its log-sum-exp (lse: that head's s values) are written. state: this
// (batch, head)'s; done: its query blocks' counters.
void attention_forward_tile(const AttentionShape& shape, HeadRows<const float> q,
                            HeadRows<const float> k, HeadRows<const float> v, HeadRows<float> out,
                            float* lse, int64_t batch, int64_t head, int64_t tile, float* state,
                            int32_t* done, float* workspace);
void attention_forward_tile(const AttentionShape& shape, HeadRows<const double> q,
                            HeadRows<const double> k, HeadRows<const double> v,
                            HeadRows<double> out, double* lse, int64_t batch, int64_t head,
                            int64_t tile, double* state, int32_t* done, double* workspace);

// Key tile `tile` of key/value head `kv_head` of batch `batch`, for the `group` query heads
// sharing it: writes that tile's dk and dv rows, and a query row's dq once its last tile is
// done. lse: [heads, s] of this batch; d_out the output's gradient; state: this (batch,
// kv_head)'s; done: its query heads' counters ([group, query blocks]).
void attention_backward_tile(const AttentionShape& shape, HeadRows<const float> q,
                             HeadRows<const float> k, HeadRows<const float> v,
                             HeadRows<const float> out, HeadRows<const float> d_out,
                             const float* lse, HeadRows<float> dq, HeadRows<float> dk,
                             HeadRows<float> dv, int64_t batch, int64_t kv_head, int64_t tile,
                             float* state, int32_t* done, float* workspace);
void attention_backward_tile(const AttentionShape& shape, HeadRows<const double> q,
                             HeadRows<const double> k, HeadRows<const double> v,
                             HeadRows<const double> out, HeadRows<const double> d_out,
                             const double* lse, HeadRows<double> dq, HeadRows<double> dk,
                             HeadRows<double> dv, int64_t batch, int64_t kv_head, int64_t tile,
                             double* state, int32_t* done, double* workspace);

}  // namespace retort::kernels
