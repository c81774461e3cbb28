// engine/config/train_config.cpp: see train_config.h.
#include "engine/config/train_config.h"

#include <fnmatch.h>

#include <algorithm>
#include <sstream>

#include "common/user_error.h"
#include "engine/config/config_schema.h"

namespace retort::engine {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw UserError("invalid config: " + message);
}

std::string str(int64_t v) {
  return std::to_string(v);
}

std::string decimal(double v) {
  std::ostringstream text;
  text << v;
  return text.str();
}

}  // namespace

double ParamPolicy::lr_scale(const std::string& name) const {
  for (const std::string& rule : lr_scales) {
    const size_t eq = rule.rfind('=');
    if (fnmatch(rule.substr(0, eq).c_str(), name.c_str(), 0) == 0)
      return std::stod(rule.substr(eq + 1));
  }
  for (const std::string& pattern : freeze)
    if (fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return 0.0;
  return 1.0;
}

TrainConfig make_train_config(const Config& source, int world_size) {
  TrainConfig config;
  for (const KeySpec& key : config_keys()) key.assign(source, config);
  // On a GPU, chunks of tokens big enough to keep its products busy (small chunks cost
  // thousands of kernel launches a step), unless the config names its own.
  constexpr int64_t kGpuChunkTokens = 4096;
  if (config.runtime.device == Device::cuda) {
    if (source.origin("memory.head_chunk_tokens") == "default")
      config.memory.head_chunk_tokens = kGpuChunkTokens;
    if (source.origin("distill.chunk_tokens") == "default")
      config.distill.objective.logits.chunk_tokens = kGpuChunkTokens;
  }

  const layers::ModelConfig& model = config.model;
  require(model.explicit_head_dim > 0 || model.hidden % model.heads == 0,
          "model.hidden=" + str(model.hidden) +
              " is not divisible by model.heads=" + str(model.heads) + " (or set model.head_dim)");
  require(model.head_dim() % 2 == 0,
          (model.explicit_head_dim > 0 ? "model.head_dim=" : "head dim model.hidden/model.heads=") +
              str(model.head_dim()) + " must be even for RoPE");
  const bool context_scaled = model.rope_scaling == layers::RopeScaling::llama3 ||
                              model.rope_scaling == layers::RopeScaling::yarn;
  require(!context_scaled || model.rope_original_context > 0,
          "model.rope_scaling=" + enum_name(model.rope_scaling) +
              " needs model.rope_original_context (the context the model was pretrained for)");
  require(model.rope_scaling != layers::RopeScaling::llama3 ||
              model.rope_high_freq_factor > model.rope_low_freq_factor,
          "model.rope_high_freq_factor=" + decimal(model.rope_high_freq_factor) +
              " must be above model.rope_low_freq_factor=" + decimal(model.rope_low_freq_factor));
  require(model.heads % model.kv_heads == 0,
          "model.heads=" + str(model.heads) +
              " is not divisible by model.kv_heads=" + str(model.kv_heads));
  require(model.layer_windows.empty() || int64_t(model.layer_windows.size()) == model.layers,
          "model.layer_windows has " + str(model.layer_windows.size()) +
              " entries but model.layers=" + str(model.layers));

  const ParamPolicy& policy = config.params;
  for (const std::string& rule : policy.lr_scales) {
    const size_t eq = rule.rfind('=');
    double scale = -1;
    try {
      if (eq != std::string::npos && eq > 0) scale = std::stod(rule.substr(eq + 1));
    } catch (const std::exception&) {
    }
    require(scale >= 0, "model.lr_scales entry '" + rule + "' is not 'glob=scale' with scale >= 0");
  }
  require(policy.init_reset.empty() || !policy.init_from.empty(),
          "model.init.reset needs model.init.from (a checkpoint to start from)");

  DistillSettings& distill_settings = config.distill;
  TeacherKeys& teacher_keys = distill_settings.keys;
  if (teacher_keys.seed == 0) teacher_keys.seed = config.seed;
  distill_settings.teacher = model;
  distill_settings.teacher.layer_windows.clear();
  distill_settings.teacher.sliding_window = teacher_keys.sliding_window;
  auto pick = [&](int64_t given, int64_t student) {
    distill_settings.teacher_shape_given |= given > 0;
    return given > 0 ? given : student;
  };
  distill_settings.teacher.hidden = pick(teacher_keys.hidden, model.hidden);
  distill_settings.teacher.layers = pick(teacher_keys.layers, model.layers);
  distill_settings.teacher.heads = pick(teacher_keys.heads, model.heads);
  distill_settings.teacher.kv_heads = pick(teacher_keys.kv_heads, model.kv_heads);
  distill_settings.teacher.ffn_hidden = pick(teacher_keys.ffn_hidden, model.ffn_hidden);
  distill_settings.teacher.explicit_head_dim = pick(teacher_keys.head_dim, model.explicit_head_dim);
  if (teacher_keys.tied_embeddings != TeacherHead::as_student) {
    distill_settings.teacher_shape_given = true;
    distill_settings.teacher.tied_embeddings = teacher_keys.tied_embeddings == TeacherHead::tied;
  }
  const distill::DistillConfig& objective = distill_settings.objective;
  require(objective.logits.teacher_top_k == 0 ||
              objective.logits.kind != distill::LogitLoss::reverse_kl,
          "distill.teacher_top_k needs forward_kl or soft_ce (reverse_kl is undefined where the "
          "top-k teacher has zero probability)");
  require(objective.logits.teacher_top_k <= model.vocab_size,
          "distill.teacher_top_k=" + str(objective.logits.teacher_top_k) +
              " is above the vocabulary (model.vocab_size=" + str(model.vocab_size) + ")");
  if (!teacher_keys.cache.empty() && objective.logit_weight > 0) {
    require(objective.logits.kind != distill::LogitLoss::reverse_kl,
            "teacher.cache holds the teacher's top k only: distill.logit_loss=reverse_kl is "
            "undefined where that teacher has zero probability; use forward_kl or soft_ce");
    require(!config.optimizer.in_backward,
            "teacher.cache: the cached logit loss forms the head's gradient in forward, which "
            "optimizer.in_backward: true (stepping the head's rows inside backward) does not "
            "take; set optimizer.in_backward: false");
  }
  distill_settings.enabled = objective.logit_weight > 0 || objective.activation_weight > 0;
  require(objective.lm_weight > 0 || distill_settings.enabled,
          "distill.lm_weight, distill.logit_weight and distill.activation_weight are all 0");
  require(objective.activation_weight == 0 || !objective.pair_names.empty() ||
              !objective.every_layer_points.empty(),
          "distill.activation_weight > 0 needs distill.activation_pairs or activation_points");
  const layers::ModelConfig& teacher = distill_settings.teacher;
  require((teacher.explicit_head_dim > 0 || teacher.hidden % teacher.heads == 0) &&
              teacher.heads % teacher.kv_heads == 0 && teacher.head_dim() % 2 == 0,
          "teacher: hidden=" + str(teacher.hidden) + ", heads=" + str(teacher.heads) +
              ", kv_heads=" + str(teacher.kv_heads) +
              " do not make whole, even heads in whole groups");

  DataConfig& data = config.data;
  require(!data.paths.empty(), "data.paths is empty: give at least one dataset prefix");
  require(data.weights.empty() || data.weights.size() == data.paths.size(),
          "data.weights has " + str(data.weights.size()) + " entries but data.paths has " +
              str(data.paths.size()));
  if (data.weights.empty()) data.weights.assign(data.paths.size(), 1.0);
  double total = 0;
  for (double w : data.weights) total += w;
  require(total > 0, "data.weights sum to zero");

  LrSchedule& schedule = config.optimizer.schedule;
  require(schedule.min_lr <= schedule.lr, "optimizer.min_lr must not exceed optimizer.lr");
  if (schedule.decay_steps == 0) schedule.decay_steps = config.training.steps;

  require(
      config.parallel.dp_reduce_dtype == ReduceDType::float32 || config.dtype == DType::bfloat16,
      "parallel.dp_reduce_dtype: bfloat16 needs model.dtype: bfloat16 (it is " +
          enum_name(config.dtype) + ")");
  const OptimizerConfig& optimizer = config.optimizer;
  require(!optimizer.in_backward || optimizer.grad_clip == 0,
          "optimizer.in_backward: true steps each parameter before the global gradient norm is "
          "known, so it cannot clip by it; set optimizer.grad_clip: 0 (it is " +
              std::to_string(optimizer.grad_clip) + ")");
  const std::vector<int64_t>& profile = config.logging.profile_steps;
  require(profile.empty() || profile.size() == 2,
          "logging.profile_steps must be [first, last] (steps count from 1) or empty; it has " +
              std::to_string(profile.size()) + " entries");
  if (profile.size() == 2) {
    const std::string given =
        "[" + std::to_string(profile[0]) + ", " + std::to_string(profile[1]) + "]";
    require(1 <= profile[0] && profile[0] <= profile[1],
            "logging.profile_steps = " + given +
                ": must be [first, last] with 1 <= first <= last (steps count from 1)");
    require(profile[0] <= config.training.steps,
            "logging.profile_steps = " + given + " starts after the last step (training.steps=" +
                std::to_string(config.training.steps) + "), so no trace would be written");
  }
  const layers::MemoryConfig& mem = config.memory;
  require(!mem.activation_offloading || mem.activation_checkpointing != layers::Checkpointing::none,
          "memory.activation_offloading: true moves what activation checkpointing keeps; set "
          "memory.activation_checkpointing to full or selective (libtorch 1.13 has no C++ "
          "saved-tensor hooks to move the tensors autograd saves itself)");

  const ParallelConfig& parallel_keys = config.parallel;
  config.layout.tensor = static_cast<int>(parallel_keys.tensor);
  config.layout.pipeline = static_cast<int>(parallel_keys.pipeline);
  config.layout.data = static_cast<int>(parallel_keys.data.value);
  config.layout.sequence_parallel = parallel_keys.sequence_parallel;
  config.layout = parallel::resolve_layout(
      config.layout, world_size,
      {model.heads, model.kv_heads, model.ffn_hidden, model.layers, data.seq_len});
  // The teacher runs in the student's layout; its pipeline stages may hold no layer.
  if (distill_settings.enabled)
    parallel::resolve_layout(
        config.layout, world_size,
        {teacher.heads, teacher.kv_heads, teacher.ffn_hidden,
         std::max<int64_t>(teacher.layers, config.layout.pipeline), data.seq_len});
  config.stages =
      parallel::split_layers(model.layers, config.layout.pipeline, parallel_keys.pipeline_split);

  const TrainingConfig& training = config.training;
  const int64_t per_step = training.micro_batch * config.layout.data;
  require(training.global_batch % per_step == 0,
          "training.global_batch=" + str(training.global_batch) +
              " is not a multiple of training.micro_batch x data-parallel ranks = " +
              str(training.micro_batch) + " x " + str(config.layout.data));
  return config;
}

}  // namespace retort::engine
