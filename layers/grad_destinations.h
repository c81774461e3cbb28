// layers/grad_destinations.h: memory that a parameter's next gradient is to be formed in,
// offered by whoever will read the gradient there (the data-parallel sum in shared memory,
// parallel/shared_reduction.h) and taken by the product that forms it (LinearProduct,
// PackedProduct), which then writes its dW = dy^T x straight into that memory instead of
// into a fresh tensor. Autograd's AccumulateGrad adopts a returned gradient nobody else
// holds without copying it, so .grad() ends up a view of the offered memory and the reader
// finds the gradient already in place (Megatron-LM's gradient-accumulation fusion, for the
// first micro-batch; later micro-batches add into .grad() in place as usual).
// An offer is taken at most once: a product takes it only when the parameter has no
// gradient yet, and removes it, so the returned tensor is the only reference to it.
// Process-wide and keyed by the parameter's tensor, so several models may offer at once.
#pragma once
#include <torch/torch.h>

#include <vector>

namespace retort::layers {

// `destination` (contiguous, param's shape and dtype) receives param's next gradient.
void offer_grad_destination(const torch::Tensor& param, torch::Tensor destination);
// Drops the offer for param, if any.
void withdraw_grad_destination(const torch::Tensor& param);
// The offer for param, removed; undefined when there is none or param already has a
// gradient (a later micro-batch: autograd adds into that one).
torch::Tensor take_grad_destination(const torch::Tensor& param);
// For weights stacked by rows [w0; w1; ...] whose gradient one product forms: their offers,
// removed, when every weight has one and they lie one after another in memory in this order
// (then one product fills them all); otherwise empty, and the offers stay.
std::vector<torch::Tensor> take_stacked_grad_destinations(at::TensorList params);

}  // namespace retort::layers
