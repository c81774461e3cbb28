// layers/blocked_product.h: C (+)= A B for the step's larger fp32 products, run by the tile loops
// (layers/tile_gemm.h) in cache blocks: rows of C in blocks of kBlockRows, the inner dimension in
// chunks of kBlockInner, and C's 32-column panels split over the threads. Each thread packs one
// chunk of one panel of B at a time (kBlockInner x 32 floats, 32 KB: it stays in L1 while every
// row block of A runs against it), and the A block (kBlockRows x kBlockInner) and the C block
// stay in L2 across the thread's panels.
//
// Why: tile_gemm runs the whole inner dimension against one packed panel, which is right for
// the attention's head-dimension products but streams the panel from L3 or memory when the
// inner dimension is long (the LM head's input gradient: 32000) and re-reads all of A from
// memory once per panel when A is large (the weight gradients dW = dy^T x).
#pragma once
#include <cstdint>

namespace retort::layers {

constexpr int64_t kBlockRows = 384;
constexpr int64_t kBlockInner = 256;

// C [m, n] = A B, or C += A B when `accumulate`. A element (i, p) at a[i * a_row + p * a_col],
// B element (p, c) at b[p * b_row + c * b_col], C row i at c + i * ldc. Runs on the compute
// threads (at::parallel_for). Only where layers::kernels::tile_gemm_available().
void blocked_product(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                     const float* b, int64_t b_row, int64_t b_col, bool accumulate, float* c,
                     int64_t ldc);

}  // namespace retort::layers
