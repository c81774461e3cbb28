// layers/attention_kernels.h: the causal (optionally sliding-window) attention of
// blocked_attention.h as fused CPU loops over one head at a time. A block of query rows meets
// the keys it can see in tiles; each tile's scores are formed by one BLAS product into a
// small workspace that stays in cache, turned into probabilities in one pass (online softmax
// in forward, the saved log-sum-exp in backward) and used by the next product at once, so no
// element-wise pass goes through memory. Backward is FlashAttention-2's: scores formed again,
// dV, dP, dS, dQ and dK per tile, dK and dV accumulated in place for the key/value head.
// On the diagonal a tile's rows go in groups of 32, each formed only up to its own last key.
// On a tile every row of the block sees whole, the forward's row maxima come out of the score
// product's registers (tile_gemm_row_max), so its online softmax is one pass over the tile.
// No torch here: the caller (layers/blocked_attention.cpp) runs heads in parallel, one BLAS
// thread each. fp32 products run as layers/tile_gemm.h on AVX-512 CPUs (K^T, V, V^T and K
// packed into panels once per head, Q and dO once per query block); fp64 and fp32 elsewhere
// call the BLAS library already loaded with libtorch (cblas_sgemm, cblas_dgemm), looked up at
// run time. Key tiles start on a 32-key boundary (keys before a window's start get
// probability 0), so a tile's K^T is whole panels.
#pragma once
#include <cstdint>

namespace retort::layers::kernels {

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

// Whether the BLAS library offers cblas_sgemm and cblas_dgemm in this process.
bool attention_blas_available();

// Workspace elements one call of either function below needs.
int64_t attention_workspace(const AttentionShape& shape);

// Query head `head` of batch `batch`: its output rows and its log-sum-exp per row (lse:
// that head's s values).
void attention_forward_head(const AttentionShape& shape, HeadRows<const float> q,
                            HeadRows<const float> k, HeadRows<const float> v, HeadRows<float> out,
                            float* lse, int64_t batch, int64_t head, float* workspace);
void attention_forward_head(const AttentionShape& shape, HeadRows<const double> q,
                            HeadRows<const double> k, HeadRows<const double> v,
                            HeadRows<double> out, double* lse, int64_t batch, int64_t head,
                            double* workspace);

// Backward of the `group` query heads sharing key/value head `kv_head` of batch `batch`:
// writes their dq rows and the dk and dv rows of that key/value head.
// lse: [heads, s] of this batch; d_out the output's gradient.
void attention_backward_kv_head(const AttentionShape& shape, HeadRows<const float> q,
                                HeadRows<const float> k, HeadRows<const float> v,
                                HeadRows<const float> out, HeadRows<const float> d_out,
                                const float* lse, HeadRows<float> dq, HeadRows<float> dk,
                                HeadRows<float> dv, int64_t batch, int64_t kv_head,
                                float* workspace);
void attention_backward_kv_head(const AttentionShape& shape, HeadRows<const double> q,
                                HeadRows<const double> k, HeadRows<const double> v,
                                HeadRows<const double> out, HeadRows<const double> d_out,
                                const double* lse, HeadRows<double> dq, HeadRows<double> dk,
                                HeadRows<double> dv, int64_t batch, int64_t kv_head,
                                double* workspace);

}  // namespace retort::layers::kernels
