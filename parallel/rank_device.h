// parallel/rank_device.h: the device a rank computes on: the CPU, or the GPU of its local rank
// (parallel/transport.h's gpu_for_local_rank), made the current CUDA device. One place for
// engine_train and engine_generate.
#pragma once
#include <torch/torch.h>

#include <string>

namespace retort::parallel {

// cuda false: the CPU. Else the GPU of local_rank (modulo gpus_per_node when not 0), made
// current. A UserError naming `setting` (the key or flag that asked for cuda) when this
// process sees no GPU.
torch::Device rank_device(bool cuda, int local_rank, int gpus_per_node, const std::string& setting);

}  // namespace retort::parallel
