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
// One set of offers per run (layers/run_context.h), keyed by the parameter's tensor, so the
// run's models (student, teacher) share it and another run's never see it.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace retort::layers {

class GradDestinations {
 public:
  GradDestinations();
  ~GradDestinations();
  GradDestinations(const GradDestinations&) = delete;
  GradDestinations& operator=(const GradDestinations&) = delete;

  // `destination` (contiguous, param's shape and dtype) receives param's next gradient.
  void offer(const torch::Tensor& param, torch::Tensor destination);
  // Drops the offer for param, if any.
  void withdraw(const torch::Tensor& param);
  // The offer for param, removed; undefined when there is none or param already has a
  // gradient (a later micro-batch: autograd adds into that one).
  torch::Tensor take(const torch::Tensor& param);
  // For weights stacked by rows [w0; w1; ...] whose gradient one product forms: their offers,
  // removed, when every weight has one and they lie one after another in memory in this order
  // (then one product fills them all); otherwise empty, and the offers stay.
  std::vector<torch::Tensor> take_stacked(at::TensorList params);

 private:
  struct Offers;
  std::unique_ptr<Offers> offers_;
};

// The same through a run's offers where there is one (null: none offered).
torch::Tensor take_grad_destination(GradDestinations* offers, const torch::Tensor& param);
std::vector<torch::Tensor> take_stacked_grad_destinations(GradDestinations* offers,
                                                          at::TensorList params);

}  // namespace retort::layers
