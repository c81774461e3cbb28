// distill/activation_losses.cpp: see activation_losses.h.
#include "distill/activation_losses.h"

#include "common/user_error.h"
#include "parallel/primitives.h"

namespace retort::distill {

torch::Tensor activation_distillation_sum(const torch::Tensor& student,
                                          const torch::Tensor& teacher, const torch::Tensor& weight,
                                          ActivationLoss kind, const layers::TensorParallel& tp) {
  torch::Tensor t = teacher.detach();
  torch::Tensor per_token;
  switch (kind) {
    case ActivationLoss::mse:
      per_token = (student - t).pow(2).mean(-1);
      break;
    case ActivationLoss::cosine:
      per_token = 1 - torch::cosine_similarity(student, t, -1, 1e-8);
      break;
    case ActivationLoss::l2:
      // sqrt(x + tiny) keeps the gradient finite where student == teacher.
      per_token = ((student - t).pow(2).sum(-1) + 1e-30).sqrt();
      break;
  }
  torch::Tensor sum = (per_token * weight.to(per_token.scalar_type())).sum();
  if (tp.sequence_parallel && tp.size() > 1) sum = parallel::reduce_from_tp(sum, *tp.group);
  return sum;
}

}  // namespace retort::distill
