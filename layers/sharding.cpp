// layers/sharding.cpp: see sharding.h.
#include "layers/sharding.h"

namespace retort::layers {

torch::Tensor to_global(const torch::Tensor& local, const layers::ParamSpec& spec,
                        const layers::TensorParallel& tp) {
  torch::Tensor full = local.detach();
  if (spec.shard_dim >= 0 && tp.size() > 1) full = tp.group->all_gather(full, spec.shard_dim);
  if (spec.padded_rows > 0) full = full.narrow(0, 0, spec.shape[0]);
  return full.contiguous();
}

torch::Tensor from_global(const torch::Tensor& global, const layers::ParamSpec& spec,
                          const layers::TensorParallel& tp, const torch::Tensor& like) {
  return layers::local_shard(layers::pad_rows(global, spec), spec, tp.position())
      .to(like.scalar_type())
      .contiguous();
}

}  // namespace retort::layers
