// engine/train_config.cpp: see train_config.h.
#include "engine/train_config.h"

#include <fnmatch.h>

#include <algorithm>

#include "common/user_error.h"

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
  t.run_dir = c.get_string("run.dir");
  t.seed = static_cast<uint64_t>(c.get_int("seed"));
  t.dtype = c.get_string("model.dtype");

  layers::ModelConfig& m = t.model;
  m.vocab_size = c.get_int("model.vocab_size");
  m.hidden = c.get_int("model.hidden");
  m.layers = c.get_int("model.layers");
  m.heads = c.get_int("model.heads");
  m.kv_heads = c.get_int("model.kv_heads");
  m.ffn_hidden = c.get_int("model.ffn_hidden");
  m.rope_theta = c.get_float("model.rope_theta");
  m.norm_eps = c.get_float("model.norm_eps");
  m.init_std = c.get_float("model.init_std");
  m.sliding_window = c.get_int("model.sliding_window");
  m.layer_windows = c.get_int_list("model.layer_windows");
  m.qkv_bias = c.get_bool("model.qkv_bias");
  m.tied_embeddings = c.get_bool("model.tied_embeddings");
  require(m.hidden % m.heads == 0,
          "model.hidden=" + str(m.hidden) + " is not divisible by model.heads=" + str(m.heads));
  require(m.head_dim() % 2 == 0,
          "head dim model.hidden/model.heads=" + str(m.head_dim()) + " must be even for RoPE");
  require(m.heads % m.kv_heads == 0,
          "model.heads=" + str(m.heads) + " is not divisible by model.kv_heads=" + str(m.kv_heads));
  require(m.layer_windows.empty() || int64_t(m.layer_windows.size()) == m.layers,
          "model.layer_windows has " + str(m.layer_windows.size()) +
              " entries but model.layers=" + str(m.layers));

  ParamPolicy& pp = t.params;
  pp.freeze = c.get_string_list("model.freeze");
  pp.lr_scales = c.get_string_list("model.lr_scales");
  pp.init_from = c.get_string("model.init.from");
  pp.init_reset = c.get_string_list("model.init.reset");
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
  ds.teacher_checkpoint = c.get_string("teacher.checkpoint");
  ds.teacher_seed = static_cast<uint64_t>(c.get_int("teacher.seed"));
  if (ds.teacher_seed == 0) ds.teacher_seed = t.seed;
  ds.teacher = m;
  auto pick = [&](const char* key, int64_t student) {
    const int64_t v = c.get_int(key);
    ds.teacher_shape_given |= v > 0;
    return v > 0 ? v : student;
  };
  ds.teacher.hidden = pick("teacher.hidden", m.hidden);
  ds.teacher.layers = pick("teacher.layers", m.layers);
  ds.teacher.heads = pick("teacher.heads", m.heads);
  ds.teacher.kv_heads = pick("teacher.kv_heads", m.kv_heads);
  ds.teacher.ffn_hidden = pick("teacher.ffn_hidden", m.ffn_hidden);
  ds.teacher.sliding_window = c.get_int("teacher.sliding_window");
  ds.teacher.layer_windows.clear();
  ds.lm_weight = c.get_float("distill.lm_weight");
  ds.logit_weight = c.get_float("distill.logit_weight");
  ds.activation_weight = c.get_float("distill.activation_weight");
  ds.logit_loss = c.get_string("distill.logit_loss");
  ds.activation_loss = c.get_string("distill.activation_loss");
  ds.temperature = c.get_float("distill.temperature");
  ds.scale_t2 = c.get_bool("distill.scale_t2");
  ds.chunk_tokens = c.get_int("distill.chunk_tokens");
  ds.teacher_top_k = c.get_int("distill.teacher_top_k");
  require(ds.teacher_top_k == 0 || ds.logit_loss != "reverse_kl",
          "distill.teacher_top_k needs forward_kl or soft_ce (reverse_kl is undefined where the "
          "top-k teacher has zero probability)");
  ds.activation_pairs = c.get_string_list("distill.activation_pairs");
  ds.activation_points = c.get_string_list("distill.activation_points");
  ds.enabled = ds.logit_weight > 0 || ds.activation_weight > 0;
  require(ds.lm_weight > 0 || ds.enabled,
          "distill.lm_weight, distill.logit_weight and distill.activation_weight are all 0");
  require(
      ds.activation_weight == 0 || !ds.activation_pairs.empty() || !ds.activation_points.empty(),
      "distill.activation_weight > 0 needs distill.activation_pairs or activation_points");
  const layers::ModelConfig& tm = ds.teacher;
  require(tm.hidden % tm.heads == 0 && tm.heads % tm.kv_heads == 0 && tm.head_dim() % 2 == 0,
          "teacher: hidden=" + str(tm.hidden) + ", heads=" + str(tm.heads) +
              ", kv_heads=" + str(tm.kv_heads) + " do not make whole, even heads in whole groups");

  DataConfig& d = t.data;
  d.paths = c.get_string_list("data.paths");
  d.weights = c.get_float_list("data.weights");
  d.valid_paths = c.get_string_list("data.valid_paths");
  d.valid_fraction = c.get_float("data.valid_fraction");
  d.seq_len = c.get_int("data.seq_len");
  require(!d.paths.empty(), "data.paths is empty: give at least one dataset prefix");
  require(d.weights.empty() || d.weights.size() == d.paths.size(),
          "data.weights has " + str(d.weights.size()) + " entries but data.paths has " +
              str(d.paths.size()));
  if (d.weights.empty()) d.weights.assign(d.paths.size(), 1.0);
  double total = 0;
  for (double w : d.weights) total += w;
  require(total > 0, "data.weights sum to zero");

  TrainingConfig& tr = t.training;
  tr.steps = c.get_int("training.steps");
  tr.micro_batch = c.get_int("training.micro_batch");
  tr.global_batch = c.get_int("training.global_batch");
  tr.log_every = c.get_int("training.log_every");
  tr.eval_every = c.get_int("training.eval_every");
  tr.eval_batches = c.get_int("training.eval_batches");

  OptimizerConfig& o = t.optimizer;
  o.lr = c.get_float("optimizer.lr");
  o.min_lr = c.get_float("optimizer.min_lr");
  o.schedule = c.get_string("optimizer.schedule");
  o.warmup_steps = c.get_int("optimizer.warmup_steps");
  o.decay_steps = c.get_int("optimizer.decay_steps");
  o.beta1 = c.get_float("optimizer.beta1");
  o.beta2 = c.get_float("optimizer.beta2");
  o.eps = c.get_float("optimizer.eps");
  o.weight_decay = c.get_float("optimizer.weight_decay");
  o.grad_clip = c.get_float("optimizer.grad_clip");
  o.zero_stage = static_cast<int>(c.get_int("optimizer.zero_stage"));
  require(o.min_lr <= o.lr, "optimizer.min_lr must not exceed optimizer.lr");

  t.checkpoint.save_every = c.get_int("checkpoint.save_every");
  t.checkpoint.save_at_end = c.get_bool("checkpoint.save_at_end");
  t.checkpoint.load = c.get_string("checkpoint.load");

  t.layout.tensor = static_cast<int>(c.get_int("parallel.tensor"));
  t.layout.pipeline = static_cast<int>(c.get_int("parallel.pipeline"));
  t.layout.data = static_cast<int>(c.get_int("parallel.data"));
  t.layout.sequence_parallel = c.get_bool("parallel.sequence_parallel");
  t.layout = parallel::resolve_layout(t.layout, world_size,
                                      {m.heads, m.kv_heads, m.ffn_hidden, m.layers, d.seq_len});
  // The teacher runs in the student's layout; its pipeline stages may hold no layer.
  if (ds.enabled)
    parallel::resolve_layout(t.layout, world_size,
                             {tm.heads, tm.kv_heads, tm.ffn_hidden,
                              std::max<int64_t>(tm.layers, t.layout.pipeline), d.seq_len});
  t.stages = parallel::split_layers(m.layers, t.layout.pipeline,
                                    c.get_int_list("parallel.pipeline_split"));

  const int64_t per_step = tr.micro_batch * t.layout.data;
  require(tr.global_batch % per_step == 0,
          "training.global_batch=" + str(tr.global_batch) +
              " is not a multiple of training.micro_batch x data-parallel ranks = " +
              str(tr.micro_batch) + " x " + str(t.layout.data));

  t.dp_bucket_mb = c.get_float("parallel.dp_bucket_mb");
  t.device = c.get_string("runtime.device");
  t.threads = static_cast<int>(c.get_int("runtime.threads"));
  t.peak_gflops = c.get_float("runtime.peak_gflops");
  return t;
}

}  // namespace retort::engine
