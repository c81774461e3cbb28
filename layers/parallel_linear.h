// layers/parallel_linear.h: the two tensor-parallel linear layers of Megatron.
//  - ColumnParallelLinear: weight [out, in] split along out; input already replicated over
//    TP (see TensorParallel::enter_column), output this rank's slice of the features. A
//    "replicated rows" variant keeps the whole weight on every rank and uses a row range
//    (kv heads shared by several TP ranks); its gradient is then summed over TP.
//  - RowParallelLinear: weight [out, in] split along in; input this rank's feature slice,
//    output summed over TP (TensorParallel::exit_row: all-reduce, or reduce-scatter along the
//    sequence under sequence parallel), then the bias, replicated, added once.
#pragma once
#include <torch/torch.h>

#include <string>

#include "layers/parameters.h"
#include "layers/run_context.h"
#include "layers/tensor_parallel.h"

namespace retort::layers {

struct LinearSpec {
  std::string name;  // prefix, e.g. "layers.0.attn.q_proj" (".weight" / ".bias" appended)
  int64_t in = 0, out = 0;
  double init_std = 0.02;
  bool bias = false;
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear(const LinearSpec& spec, ParameterStore& store, const TensorParallel& tp);
  // Keeps the whole weight and uses rows [row_offset, row_offset + rows) on this rank.
  ColumnParallelLinear(const LinearSpec& spec, ParameterStore& store, int64_t row_offset,
                       int64_t rows);
  // [..., in] -> [..., out_local]; the product is `run`'s (layers/run_context.h; null: none).
  torch::Tensor forward(const torch::Tensor& x, RunContext* run = nullptr) const;
  // The rows of weight and bias this rank multiplies by (bias undefined without one).
  torch::Tensor local_weight() const;
  torch::Tensor local_bias() const;
  // Whether the whole local weight is used (no row range), so it can share a buffer.
  bool uses_whole_weight() const { return rows_ == 0; }
  // The parameter itself (handles to the same tensors the store holds).
  torch::Tensor weight() const { return weight_; }

 private:
  torch::Tensor weight_, bias_;
  int64_t row_offset_ = 0, rows_ = 0;  // rows_ == 0: use the whole local weight
};

// Several column-parallel linears reading the same input as one matrix product by their
// stacked local weights: [..., in] -> [..., sum of out_local], each one's output a slice of
// the last dimension in the order given (q|k|v, gate|up). One larger product runs faster than
// several small ones, and its backward forms the input's gradient in one product instead of
// a sum of several. The parameters stay separate (checkpoints, TP slicing unchanged). When
// their weights lie one after another in memory (place_adjacent) the product reads them in
// place; otherwise they are stacked into a temporary copy in forward and again in backward,
// so no stacked copy is kept between them.
torch::Tensor packed_column_forward(const std::vector<const ColumnParallelLinear*>& parts,
                                    const torch::Tensor& x, RunContext* run = nullptr);

// Moves the weights of `parts` into one buffer, in this order, so packed_column_forward
// multiplies by them without stacking a copy each step (biases, small, are still stacked). Names,
// shapes, values and requires_grad are unchanged; only the storage becomes shared (as Python's
// `p.data = flat[i:j].view_as(p)`). Parts that use a row range of their weight are left as
// they are.
void place_adjacent(const std::vector<const ColumnParallelLinear*>& parts);

// The matrices stacked along rows: a view when they lie one after another in one storage
// (contiguous, same width), else a copy (torch::cat).
torch::Tensor stacked_rows(at::TensorList matrices);

class RowParallelLinear {
 public:
  RowParallelLinear(const LinearSpec& spec, ParameterStore& store, const TensorParallel& tp);
  // [..., in_local] -> [..., out] summed; the product is `run`'s.
  torch::Tensor forward(const torch::Tensor& x, RunContext* run = nullptr) const;

 private:
  torch::Tensor weight_, bias_;
  TensorParallel tp_;
};

}  // namespace retort::layers
