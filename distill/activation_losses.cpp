// distill/activation_losses.cpp: see activation_losses.h.
#include "distill/activation_losses.h"

#include "common/user_error.h"
#include "layers/accumulation_type.h"
#include "parallel/primitives.h"

namespace retort::distill {

torch::Tensor activation_distillation_sum(const torch::Tensor& student,
                                          const torch::Tensor& teacher, const torch::Tensor& weight,
                                          ActivationLoss kind, const layers::TensorParallel& tp) {
  // Taken in float32 for 16-bit activations (the difference of two bf16 values near each other
  // keeps few of its bits otherwise); the gradient returns to the student in its own type.
  const torch::ScalarType type = layers::accumulation_type(student);
  const torch::Tensor s = student.to(type);
  const torch::Tensor t = teacher.detach().to(type);
  torch::Tensor per_token;
  switch (kind) {
    case ActivationLoss::mse:
      per_token = (s - t).pow(2).mean(-1);
      break;
    case ActivationLoss::cosine:
      per_token = 1 - torch::cosine_similarity(s, t, -1, 1e-8);
      break;
    case ActivationLoss::l2:
      // sqrt(x + tiny) keeps the gradient finite where student == teacher.
      per_token = ((s - t).pow(2).sum(-1) + 1e-30).sqrt();
      break;
  }
  torch::Tensor sum = (per_token * weight.to(per_token.scalar_type())).sum();
  if (tp.sequence_parallel && tp.size() > 1) sum = parallel::reduce_from_tp(sum, *tp.group);
  return sum;
}

}  // namespace retort::distill
