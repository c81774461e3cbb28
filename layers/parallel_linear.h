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
  torch::Tensor forward(const torch::Tensor& x) const;  // [..., in] -> [..., out_local]

 private:
  torch::Tensor weight_, bias_;
  int64_t row_offset_ = 0, rows_ = 0;  // rows_ == 0: use the whole local weight
};

class RowParallelLinear {
 public:
  RowParallelLinear(const LinearSpec& spec, ParameterStore& store, const TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x) const;  // [..., in_local] -> [..., out] summed

 private:
  torch::Tensor weight_, bias_;
  TensorParallel tp_;
};

}  // namespace retort::layers
