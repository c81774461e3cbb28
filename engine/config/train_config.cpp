// engine/config/train_config.cpp: see train_config.h.
#include "engine/config/train_config.h"

#include <fnmatch.h>

#include <algorithm>

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

TrainConfig make_train_config(const Config& c, int world_size) {
  TrainConfig t;
  for (const KeySpec& key : config_keys()) key.assign(c, t);

  const layers::ModelConfig& m = t.model;
  require(m.hidden % m.heads == 0,
          "model.hidden=" + str(m.hidden) + " is not divisible by model.heads=" + str(m.heads));
  require(m.head_dim() % 2 == 0,
          "head dim model.hidden/model.heads=" + str(m.head_dim()) + " must be even for RoPE");
  require(m.heads % m.kv_heads == 0,
          "model.heads=" + str(m.heads) + " is not divisible by model.kv_heads=" + str(m.kv_heads));
  require(m.layer_windows.empty() || int64_t(m.layer_windows.size()) == m.layers,
          "model.layer_windows has " + str(m.layer_windows.size()) +
              " entries but model.layers=" + str(m.layers));

  const ParamPolicy& pp = t.params;
  for (const std::string& rule : pp.lr_scales) {
    const size_t eq = rule.rfind('=');
    double scale = -1;
    try {
      if (eq != std::string::npos && eq > 0) scale = std::stod(rule.substr(eq + 1));
    } catch (const std::exception&) {
    }
    require(scale >= 0, "model.lr_scales entry '" + rule + "' is not 'glob=scale' with scale >= 0");
  }
  require(pp.init_reset.empty() || !pp.init_from.empty(),
          "model.init.reset needs model.init.from (a checkpoint to start from)");

  DistillSettings& ds = t.distill;
  TeacherKeys& tk = ds.keys;
  if (tk.seed == 0) tk.seed = t.seed;
  ds.teacher = m;
  ds.teacher.layer_windows.clear();
  ds.teacher.sliding_window = tk.sliding_window;
  auto pick = [&](int64_t given, int64_t student) {
    ds.teacher_shape_given |= given > 0;
    return given > 0 ? given : student;
  };
  ds.teacher.hidden = pick(tk.hidden, m.hidden);
  ds.teacher.layers = pick(tk.layers, m.layers);
  ds.teacher.heads = pick(tk.heads, m.heads);
  ds.teacher.kv_heads = pick(tk.kv_heads, m.kv_heads);
  ds.teacher.ffn_hidden = pick(tk.ffn_hidden, m.ffn_hidden);
  const distill::DistillConfig& dc = ds.objective;
  require(dc.logits.teacher_top_k == 0 || dc.logits.kind != distill::LogitLoss::reverse_kl,
          "distill.teacher_top_k needs forward_kl or soft_ce (reverse_kl is undefined where the "
          "top-k teacher has zero probability)");
  ds.enabled = dc.logit_weight > 0 || dc.activation_weight > 0;
  require(dc.lm_weight > 0 || ds.enabled,
          "distill.lm_weight, distill.logit_weight and distill.activation_weight are all 0");
  require(dc.activation_weight == 0 || !dc.pair_names.empty() || !dc.every_layer_points.empty(),
          "distill.activation_weight > 0 needs distill.activation_pairs or activation_points");
  const layers::ModelConfig& tm = ds.teacher;
  require(tm.hidden % tm.heads == 0 && tm.heads % tm.kv_heads == 0 && tm.head_dim() % 2 == 0,
          "teacher: hidden=" + str(tm.hidden) + ", heads=" + str(tm.heads) +
              ", kv_heads=" + str(tm.kv_heads) + " do not make whole, even heads in whole groups");

  DataConfig& d = t.data;
  require(!d.paths.empty(), "data.paths is empty: give at least one dataset prefix");
  require(d.weights.empty() || d.weights.size() == d.paths.size(),
          "data.weights has " + str(d.weights.size()) + " entries but data.paths has " +
              str(d.paths.size()));
  if (d.weights.empty()) d.weights.assign(d.paths.size(), 1.0);
  double total = 0;
  for (double w : d.weights) total += w;
  require(total > 0, "data.weights sum to zero");

  LrSchedule& schedule = t.optimizer.schedule;
  require(schedule.min_lr <= schedule.lr, "optimizer.min_lr must not exceed optimizer.lr");
  if (schedule.decay_steps == 0) schedule.decay_steps = t.training.steps;

  const OptimizerConfig& o = t.optimizer;
  require(!o.in_backward || o.grad_clip == 0,
          "optimizer.in_backward: true steps each parameter before the global gradient norm is "
          "known, so it cannot clip by it; set optimizer.grad_clip: 0 (it is " +
              std::to_string(o.grad_clip) + ")");
  const std::vector<int64_t>& profile = t.logging.profile_steps;
  require(profile.empty() || profile.size() == 2,
          "logging.profile_steps must be [first, last] (steps count from 1) or empty; it has " +
              std::to_string(profile.size()) + " entries");
  if (profile.size() == 2) {
    const std::string given =
        "[" + std::to_string(profile[0]) + ", " + std::to_string(profile[1]) + "]";
    require(1 <= profile[0] && profile[0] <= profile[1],
            "logging.profile_steps = " + given +
                ": must be [first, last] with 1 <= first <= last (steps count from 1)");
    require(profile[0] <= t.training.steps,
            "logging.profile_steps = " + given + " starts after the last step (training.steps=" +
                std::to_string(t.training.steps) + "), so no trace would be written");
  }
  const layers::MemoryConfig& mem = t.memory;
  require(!mem.activation_offloading || mem.activation_checkpointing != layers::Checkpointing::none,
          "memory.activation_offloading: true moves what activation checkpointing keeps; set "
          "memory.activation_checkpointing to full or selective (libtorch 1.13 has no C++ "
          "saved-tensor hooks to move the tensors autograd saves itself)");

  const ParallelConfig& p = t.parallel;
  t.layout.tensor = static_cast<int>(p.tensor);
  t.layout.pipeline = static_cast<int>(p.pipeline);
  t.layout.data = static_cast<int>(p.data.value);
  t.layout.sequence_parallel = p.sequence_parallel;
  t.layout = parallel::resolve_layout(t.layout, world_size,
                                      {m.heads, m.kv_heads, m.ffn_hidden, m.layers, d.seq_len});
  // The teacher runs in the student's layout; its pipeline stages may hold no layer.
  if (ds.enabled)
    parallel::resolve_layout(t.layout, world_size,
                             {tm.heads, tm.kv_heads, tm.ffn_hidden,
                              std::max<int64_t>(tm.layers, t.layout.pipeline), d.seq_len});
  t.stages = parallel::split_layers(m.layers, t.layout.pipeline, p.pipeline_split);

  const TrainingConfig& tr = t.training;
  const int64_t per_step = tr.micro_batch * t.layout.data;
  require(tr.global_batch % per_step == 0,
          "training.global_batch=" + str(tr.global_batch) +
              " is not a multiple of training.micro_batch x data-parallel ranks = " +
              str(tr.micro_batch) + " x " + str(t.layout.data));
  return t;
}

}  // namespace retort::engine
