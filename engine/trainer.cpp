// engine/trainer.cpp: see trainer.h.
#include "engine/trainer.h"

#include <fnmatch.h>

#include <chrono>
#include <filesystem>
#include <ostream>

#include "common/fault_injection.h"
#include "common/user_error.h"
#include "engine/batches.h"
#include "engine/gemm_peak.h"
#include "engine/memory_tracker.h"
#include "engine/sharding.h"

namespace retort::engine {
namespace fs = std::filesystem;

Trainer::Trainer(const TrainConfig& config, std::ostream* log, parallel::Mesh* mesh)
    : config_(config),
      log_(log),
      mesh_(mesh),
      dtype_(config.dtype == "float64" ? torch::kDouble : torch::kFloat) {
  if (config_.device == "cuda")
    throw UserError(torch::cuda::is_available()
                        ? "runtime.device=cuda: placing the model on the GPU is not built yet; "
                          "use runtime.device=cpu"
                        : "runtime.device=cuda: this libtorch has no CUDA support (CPU-only "
                          "build) or no GPU is visible; use runtime.device=cpu");
  const parallel::Layout& layout = config_.layout;
  if (!mesh_ && layout.tensor * layout.pipeline * layout.data != 1)
    throw UserError("layout " + parallel::describe(layout) + " needs MPI ranks");
  int stage_index = 0;
  if (mesh_) {
    tp_.group = &mesh_->tp();
    tp_.sequence_parallel = layout.sequence_parallel && layout.tensor > 1;
    dp_rank_ = mesh_->dp().rank();
    dp_size_ = mesh_->dp().size();
    stage_index = mesh_->coordinates().pp;
    if (layout.pipeline > 1) pipeline_ = &mesh_->pp();
  }
  if (!config_.stages.empty()) {
    const parallel::LayerRange& layers = config_.stages.at(stage_index);
    stage_ = {layers.first, layers.end, stage_index == 0, stage_index == layout.pipeline - 1};
  }
  store_ = std::make_unique<layers::ParameterStore>(config_.seed, dtype_, tp_.position());
  store_->set_lr_scale_rule(
      [this](const std::string& name) { return config_.params.lr_scale(name); });
  model_ = std::make_unique<layers::LlamaModel>(config_.model, *store_, tp_, stage_);
  initialise_student();
  build_distiller();
  if (dp_size_ > 1 && config_.optimizer.zero_stage == 1) {
    zero_ = std::make_unique<ZeroPartition>(*store_, mesh_->dp());
    optimizer_ = std::make_unique<AdamW>(*store_, config_.optimizer,
                                         [this](size_t i) { return zero_->owns(i); });
  } else {
    optimizer_ = std::make_unique<AdamW>(*store_, config_.optimizer);
    if (dp_size_ > 1)
      dp_sync_ = std::make_unique<DataParallelGradSync>(
          *store_, mesh_->dp(), static_cast<int64_t>(config_.dp_bucket_mb * 1e6));
  }
  streams_ = build_sample_streams(config_.data, config_.seed);

  schedule_.lr = config_.optimizer.lr;
  schedule_.min_lr = config_.optimizer.min_lr;
  schedule_.warmup_steps = config_.optimizer.warmup_steps;
  schedule_.decay_steps =
      config_.optimizer.decay_steps > 0 ? config_.optimizer.decay_steps : config_.training.steps;
  schedule_.kind = config_.optimizer.schedule;
  progress_.seed = config_.seed;
  progress_.model_json = model_config_json(config_.model);

  if (!config_.checkpoint.load.empty()) {
    const std::string path = resolve_checkpoint(config_.checkpoint.load);
    progress_ = load_checkpoint(path, *store_, optimizer_.get(), tp_, pipeline_);
    progress_.model_json = model_config_json(config_.model);
    if (progress_.seed != config_.seed)
      throw UserError("checkpoint '" + path + "' was trained with seed " +
                      std::to_string(progress_.seed) + " but the config has seed " +
                      std::to_string(config_.seed) + "; the data order would differ");
    log_line("resumed from " + path + " at step " + std::to_string(progress_.step));
  }
  flops_per_token_ = config_.model.training_flops_per_token(config_.data.seq_len);
  peak_gflops_ = config_.peak_gflops > 0 ? config_.peak_gflops : measure_gemm_gflops();
}

void Trainer::initialise_student() {
  const ParamPolicy& policy = config_.params;
  if (policy.init_from.empty()) return;
  const std::string path = resolve_checkpoint(policy.init_from);
  load_checkpoint(path, *store_, nullptr, tp_, pipeline_);  // parameters only, strictly
  torch::NoGradGuard no_grad;
  // Parameters reset per pattern; summed over pipeline stages, which hold different ones.
  torch::Tensor matched = torch::zeros({int64_t(policy.init_reset.size()) + 1}, torch::kLong);
  int64_t reset = 0;
  for (auto& p : store_->all()) {
    bool matches = false;
    for (size_t i = 0; i < policy.init_reset.size(); ++i)
      if (fnmatch(policy.init_reset[i].c_str(), p.spec.name.c_str(), 0) == 0) {
        matches = true;
        matched[i] += 1;
      }
    if (!matches) continue;
    p.value.copy_(
        from_global(layers::initial_global_value(p.spec, config_.seed), p.spec, tp_, p.value));
    reset += !p.spec.tied_copy;
  }
  matched[-1] = reset;
  if (pipeline_) pipeline_->all_reduce(matched);
  for (size_t i = 0; i < policy.init_reset.size(); ++i)
    if (matched[i].item<int64_t>() == 0)
      throw UserError("model.init.reset: pattern '" + policy.init_reset[i] +
                      "' matches no parameter");
  reset = matched[-1].item<int64_t>();
  log_line("initialised from " + path + " (" + std::to_string(reset) + " parameters reset)");
}

void Trainer::build_distiller() {
  const DistillSettings& d = config_.distill;
  if (!d.enabled) return;
  layers::ModelConfig teacher_model = d.teacher;
  std::string teacher_path;
  if (!d.teacher_checkpoint.empty()) {
    teacher_path = resolve_checkpoint(d.teacher_checkpoint);
    // Without explicit teacher sizes, the checkpoint's own model description decides.
    if (!d.teacher_shape_given)
      if (auto stored = read_checkpoint_model(teacher_path)) teacher_model = *stored;
    const parallel::Layout& l = config_.layout;
    parallel::resolve_layout(
        l, l.tensor * l.pipeline * l.data,
        {teacher_model.heads, teacher_model.kv_heads, teacher_model.ffn_hidden,
         std::max<int64_t>(teacher_model.layers, l.pipeline), config_.data.seq_len});
  }
  std::vector<distill::ActivationPair> pairs = distill::make_activation_pairs(
      d.activation_pairs, d.activation_points, config_.model.layers, teacher_model.layers);
  // Under pipeline parallelism the teacher's layers are split so that each pair's teacher
  // layer runs on the stage of its student layer (its hidden state travels with the student's).
  layers::ModelStage teacher_stage;
  if (pipeline_) {
    std::vector<std::pair<int, int64_t>> pins;
    if (d.activation_weight > 0)
      for (const distill::ActivationPair& pair : pairs)
        pins.emplace_back(
            parallel::stage_of_layer(config_.stages, layers::capture_layer(pair.student)),
            layers::capture_layer(pair.teacher));
    const parallel::LayerRange teacher_layers = parallel::split_layers_pinned(
        teacher_model.layers, config_.layout.pipeline, pins)[pipeline_->rank()];
    teacher_stage = {teacher_layers.first, teacher_layers.end, stage_.embedding, stage_.head};
  }
  teacher_ =
      std::make_unique<distill::Teacher>(teacher_model, d.teacher_seed, dtype_, tp_, teacher_stage);
  if (!teacher_path.empty())
    load_checkpoint(teacher_path, teacher_->parameters(), nullptr, tp_, pipeline_);
  distill::DistillConfig dc;
  dc.lm_weight = d.lm_weight;
  dc.logit_weight = d.logit_weight;
  dc.activation_weight = d.activation_weight;
  dc.logits.kind = distill::parse_logit_loss(d.logit_loss);
  dc.logits.temperature = d.temperature;
  dc.logits.scale_by_t2 = d.scale_t2;
  dc.logits.chunk_tokens = d.chunk_tokens;
  dc.logits.teacher_top_k = d.teacher_top_k;
  dc.activation_kind = distill::parse_activation_loss(d.activation_loss);
  dc.pairs = std::move(pairs);
  distiller_ =
      std::make_unique<distill::Distiller>(dc, *teacher_, config_.model, *store_, tp_, stage_);
}

torch::Tensor Trainer::micro_batch_loss(const TokenBatch& b, double target_count,
                                        int64_t first_sample, int64_t step) {
  torch::Tensor tokens = to_tensor(b.inputs, b.batch), targets = to_tensor(b.targets, b.batch);
  layers::CaptureSink sink(wanted_captures()), teacher_sink(wanted_teacher_captures());
  layers::CaptureSink* sink_or_null = sink.wants_any() ? &sink : nullptr;
  const bool inspect = inspecting_captures();
  if (!distiller_) {
    torch::Tensor loss = model_->loss_sum(tokens, targets, sink_or_null) / target_count;
    if (inspect) inspector_->on_captures(step, first_sample, sink, teacher_sink);
    return loss;
  }
  torch::Tensor teacher_logits =
      distiller_->needs_teacher() || teacher_sink.wants_any()
          ? teacher_->forward(tokens, &teacher_sink)
          : torch::Tensor();
  torch::Tensor logits = model_->forward(tokens, sink_or_null);
  // Before the distiller takes (and frees) the teacher's captures.
  if (inspect) inspector_->on_captures(step, first_sample, sink, teacher_sink);
  return distiller_->loss(logits, teacher_logits, targets, sink, teacher_sink, target_count,
                          config_.model.vocab_size, &step_terms_);
}

double Trainer::dp_sum(double value) {
  if (dp_size_ == 1) return value;
  torch::Tensor t = torch::tensor({value}, torch::kDouble);
  mesh_->dp().all_reduce(t);
  return t.item<double>();
}

void Trainer::sum_step_over(parallel::Communicator& group, double& loss) {
  // One all-reduce: the loss, and its parts when distilling (LM-only steps send one scalar).
  std::vector<double> values = {loss};
  if (distiller_) {
    values.insert(values.end(), {step_terms_.lm, step_terms_.logits, step_terms_.activations});
    for (const auto& [name, value] : step_terms_.per_pair) values.push_back(value);
  }
  torch::Tensor t = torch::tensor(values, torch::kDouble);
  group.all_reduce(t);
  auto sums = t.accessor<double, 1>();
  loss = sums[0];
  if (!distiller_) return;
  step_terms_.lm = sums[1];
  step_terms_.logits = sums[2];
  step_terms_.activations = sums[3];
  int64_t i = 4;
  for (auto& [name, value] : step_terms_.per_pair) value = sums[i++];
}

std::set<std::string> Trainer::wanted_captures() const {
  std::set<std::string> wanted = inspector_ ? inspector_->captures : std::set<std::string>{};
  if (distiller_) {
    auto s = distiller_->student_captures();
    wanted.insert(s.begin(), s.end());
  }
  return wanted;
}

std::set<std::string> Trainer::wanted_teacher_captures() const {
  if (!distiller_) return {};
  std::set<std::string> wanted =
      inspector_ ? inspector_->teacher_captures : std::set<std::string>{};
  auto t = distiller_->teacher_captures();
  wanted.insert(t.begin(), t.end());
  return wanted;
}

void Trainer::log_line(const std::string& line) {
  if (log_) *log_ << line << std::endl;
}

torch::Tensor Trainer::to_tensor(const std::vector<int64_t>& values, int64_t batch) const {
  return torch::tensor(values, torch::kLong).view({batch, -1});
}

double Trainer::train_step() {
  const TrainingConfig& t = config_.training;
  BatchPlan plan(t.global_batch, t.micro_batch, dp_size_, dp_rank_);
  std::vector<TokenBatch> micro;
  std::vector<int64_t> first_samples;  // of each micro-batch, in the global batch
  int64_t local_targets = 0;
  for (int64_t m = 0; m < plan.micro_batches_per_step(); ++m) {
    const int64_t first = plan.first_sample(progress_.step, m);
    first_samples.push_back(first - progress_.step * t.global_batch);
    micro.push_back(read_batch(*streams_.train, first, t.micro_batch));
    local_targets += int64_t(micro.back().targets.size());  // no padding: every target counts
  }
  // Losses are normalised by the target count of the whole global batch.
  const double target_count = dp_sum(double(local_targets));
  for (auto& p : store_->all())
    if (p.value.grad().defined()) p.value.mutable_grad().reset();

  double loss_value = 0;
  step_terms_ = distill::LossTerms();
  if (distiller_ && distiller_->uses_activations())  // every stage reports every pair
    for (const distill::ActivationPair& pair : distiller_->pairs())
      step_terms_.per_pair[pair.student] = 0;
  if (pipeline_) loss_value = pipeline_micro_batches(micro, first_samples, target_count);
  for (size_t m = 0; m < micro.size() && !pipeline_; ++m) {
    if (dp_sync_ && m + 1 == micro.size()) dp_sync_->arm();
    torch::Tensor loss =
        micro_batch_loss(micro[m], target_count, first_samples[m], progress_.step + 1);
    loss.backward();
    loss_value += loss.item<double>();
  }
  if (pipeline_) sum_step_over(*pipeline_, loss_value);  // each stage computed its own parts
  // DP buckets first: finish() writes the bucket sums back over .grad(), so the TP partial
  // sums must come after it (both are sums, so the order is otherwise free).
  if (dp_sync_) dp_sync_->finish();
  if (config_.model.tied_embeddings && mesh_ && mesh_->embedding() &&
      !fault_injected(Fault::TiedSumSkipped))
    sum_tied_grads(*store_, "embed.weight", *mesh_->embedding());
  sum_partial_tp_grads(*store_, tp_);
  if (layers::Parameter* p = store_->find(kFaultParameter)) {
    if (fault_injected(Fault::GradScaled)) p->value.mutable_grad().mul_(1 + 1e-3);
    if (fault_injected(Fault::GradMissing)) p->value.mutable_grad().reset();
  }
  if (dp_size_ > 1) sum_step_over(mesh_->dp(), loss_value);
  if (!distiller_) step_terms_.lm = loss_value;
  if (zero_) zero_->reduce_scatter_gradients(*store_);
  if (inspector_ && inspector_->on_gradients)
    inspector_->on_gradients(progress_.step + 1, loss_value);
  last_grad_norm_ = clip_grad_norm(*store_, config_.optimizer.grad_clip, tp_,
                                   zero_ ? &zero_->group() : nullptr, pipeline_);
  last_lr_ = schedule_.at(progress_.step);
  optimizer_->begin_step();
  optimizer_->step_all(last_lr_);
  if (zero_) zero_->all_gather_parameters(*store_);
  if (inspector_ && inspector_->on_step_end)
    inspector_->on_step_end(progress_.step + 1, last_grad_norm_);
  progress_.step += 1;
  progress_.consumed_samples += t.global_batch;
  return loss_value;
}

double Trainer::evaluate() {
  if (!streams_.valid) return std::nan("");
  torch::NoGradGuard no_grad;
  const TrainingConfig& t = config_.training;
  double loss_sum = 0, count = 0;
  const int64_t samples = t.eval_batches * t.global_batch;
  // Micro-batches are dealt round-robin to DP ranks; sums and counts are then combined.
  std::vector<TokenBatch> mine;
  int64_t index = 0;
  for (int64_t first = 0; first < samples; first += t.micro_batch, ++index) {
    if (index % dp_size_ != dp_rank_) continue;
    mine.push_back(read_batch(*streams_.valid, first, std::min(t.micro_batch, samples - first)));
    count += double(layers::count_targets(to_tensor(mine.back().targets, mine.back().batch)));
  }
  if (pipeline_) {
    loss_sum = pipeline_evaluate_loss_sum(mine);  // on the last stage, 0 elsewhere
    torch::Tensor sum = torch::tensor({loss_sum}, torch::kDouble);
    pipeline_->all_reduce(sum);
    loss_sum = sum.item<double>();
  } else {
    for (const TokenBatch& b : mine)
      loss_sum += model_->loss_sum(to_tensor(b.inputs, b.batch), to_tensor(b.targets, b.batch))
                      .item<double>();
  }
  return dp_sum(loss_sum) / dp_sum(count);
}

void Trainer::save(const std::string& path) {
  // Under pipeline parallelism the stages send theirs to the writer over its pipeline group.
  const bool writer_group = mesh_ && mesh_->coordinates().tp == 0 && dp_rank_ == 0;
  save_checkpoint(path, *store_, optimizer_.get(), progress_, tp_, is_root(), zero_.get(),
                  writer_group ? pipeline_ : nullptr);
  log_line("saved checkpoint " + path);
}

std::vector<double> Trainer::run() {
  const TrainingConfig& t = config_.training;
  std::unique_ptr<MetricsFile> metrics;
  if (is_root()) {
    fs::create_directories(config_.run_dir);
    metrics = std::make_unique<MetricsFile>((fs::path(config_.run_dir) / "metrics.jsonl").string());
  }
  MemoryTracker& memory = MemoryTracker::install();
  std::vector<double> losses;
  if (progress_.step >= t.steps) {
    log_line("nothing to do: already at step " + std::to_string(progress_.step) + " of " +
             std::to_string(t.steps));
    return losses;
  }
  using clock = std::chrono::steady_clock;
  auto interval_start = clock::now();
  int64_t interval_steps = 0;
  while (progress_.step < t.steps) {
    const double loss = train_step();
    losses.push_back(loss);
    ++interval_steps;
    const int64_t step = progress_.step;
    const bool eval_now = t.eval_every > 0 && (step % t.eval_every == 0 || step == t.steps);
    if (step % t.log_every == 0 || step == t.steps || eval_now) {
      const double seconds = std::chrono::duration<double>(clock::now() - interval_start).count();
      StepMetrics m;
      m.step = step;
      m.total_steps = t.steps;
      m.loss = loss;
      m.lr = last_lr_;
      m.grad_norm = last_grad_norm_;
      m.tokens_per_s = double(interval_steps * t.global_batch * config_.data.seq_len) / seconds;
      const int world = mesh_ ? mesh_->world().size() : 1;
      m.mfu = m.tokens_per_s * flops_per_token_ / (peak_gflops_ * 1e9 * world);
      m.peak_mem_bytes = memory.peak_bytes();
      m.eta_s = seconds / double(interval_steps) * double(t.steps - step);
      if (eval_now && streams_.valid) m.valid_loss = evaluate();
      if (distiller_) {
        m.parts["lm_loss"] = step_terms_.lm;
        m.parts["logit_loss"] = step_terms_.logits;
        m.parts["activation_loss"] = step_terms_.activations;
        for (const auto& [name, value] : step_terms_.per_pair)
          m.parts["activation_loss." + name] = value;
      }
      log_line(format_console_line(m));
      if (metrics) metrics->write(m);
      interval_start = clock::now();
      interval_steps = 0;
    }
    const bool save_now =
        (config_.checkpoint.save_every > 0 && step % config_.checkpoint.save_every == 0) ||
        (step == t.steps && config_.checkpoint.save_at_end);
    if (save_now) save(checkpoint_path(config_.run_dir, step));
  }
  return losses;
}

}  // namespace retort::engine
