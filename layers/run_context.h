// layers/run_context.h: what one run's layers share beyond their parameters: the kernel mode
// (kernels/dispatch.h), the compute copies of its weights (layers/compute_copy.h) and the
// memory offered for its gradients (layers/grad_destinations.h). A trainer owns one and hands
// it to its model, its teacher and its distiller (through their KernelPolicy), so two runs in
// one process never share any of it; a model built alone owns its own. Code that calls a layer
// function with no run (tests, benches) gets the environment's kernel mode, casts at each use
// and has no gradient memory offered.
#pragma once
#include "layers/compute_copy.h"
#include "layers/grad_destinations.h"
#include "layers/kernel_policy.h"

namespace retort::layers {

struct RunContext {
  kernels::KernelMode mode = environment_kernel_mode();
  ComputeCopies copies;
  GradDestinations gradients;
};

inline kernels::KernelMode mode_of(const RunContext* run) {
  return run ? run->mode : environment_kernel_mode();
}
inline ComputeCopies* copies_of(RunContext* run) {
  return run ? &run->copies : nullptr;
}
inline GradDestinations* gradients_of(RunContext* run) {
  return run ? &run->gradients : nullptr;
}

inline kernels::KernelMode KernelPolicy::mode() const {
  return mode_of(run);
}

}  // namespace retort::layers
