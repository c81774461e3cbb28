// engine/train/trainer_builder.h: what a Trainer is made of (TrainerParts) and the builder that
// assembles it from a validated config: the device and each group's transport, the parameter
// store and this stage's model (initialised, or loaded from init_from), the teacher and
// distiller, the gradient sync, AdamW, the LM head's gradient mode and its stepper, the data
// streams, the resumed position, the compute peak behind MFU. Which keys have no effect in the
// run is decided and logged here, once. The Trainer only stores the parts and connects its
// step-in-backward to the sync.
#pragma once
#include <torch/torch.h>

#include <iosfwd>
#include <memory>
#include <string>

#include "distill/distillation.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/config/precision_policy.h"
#include "engine/config/train_config.h"
#include "engine/data/data_setup.h"
#include "engine/optim/adamw.h"
#include "engine/optim/grad_hooks.h"
#include "engine/optim/grad_sync.h"
#include "engine/optim/head_row_step.h"
#include "engine/teacher_cache/cached_teacher.h"
#include "engine/teacher_cache/teacher_source.h"
#include "engine/train/head_gradient.h"
#include "engine/train/stage_step.h"
#include "layers/model.h"
#include "layers/run_context.h"
#include "parallel/mesh.h"

namespace retort::engine {

// Declared in the order a Trainer must destroy them in reverse: the run context outlives every
// part that uses it.
struct TrainerParts {
  layers::TensorParallel tp;
  torch::Device device = torch::kCPU;       // runtime.device: the CPU or this rank's GPU
  std::unique_ptr<layers::RunContext> run;  // kernel mode, compute copies, gradient memory
  std::unique_ptr<layers::ParameterStore> store;
  std::unique_ptr<layers::LlamaModel> model;
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<distill::Teacher> teacher;            // null unless distilling (and running it)
  std::unique_ptr<CachedTeacher> cached_teacher;        // teacher.cache: the logits' teacher
  std::unique_ptr<CachedTeacher> valid_cached_teacher;  // its validation samples, if any
  std::unique_ptr<distill::Distiller> distiller;
  std::unique_ptr<GradientSync> sync;
  int64_t shared_gradient_bytes = 0;  // its shared-memory segments (memory accounting)
  std::unique_ptr<StageStep> stage_step;
  std::unique_ptr<layers::ActivationOffloader> offloader;
  HeadGradient head_gradient = HeadGradient::none;      // how the head's gradient travels
  std::unique_ptr<HeadRowStepper> head_stepper;         // in-backward step, or DP reduce (tied)
  std::unique_ptr<GradReadyHooks> gradient_accounting;  // files gradients under their category
  SampleStreams streams;
  TrainingProgress progress;  // fresh, or where the loaded checkpoint left off
  double flops_per_token = 0;
  double peak_gflops = 0;  // per rank, the denominator of MFU
};

// `mesh`: this rank's parallel context (its layout must be config.layout); `log` receives the
// start-up lines (world rank 0 only). Collective over the world.
TrainerParts build_trainer_parts(const TrainConfig& config, std::ostream* log,
                                 parallel::Mesh& mesh);

// The torch type of a number type of the precision policy.
torch::ScalarType scalar_type_of(NumberType type);

}  // namespace retort::engine
