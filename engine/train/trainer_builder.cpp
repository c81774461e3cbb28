// engine/train/trainer_builder.cpp: see trainer_builder.h. The builder's members carry the
// names of the Trainer's that they become.
#include "engine/train/trainer_builder.h"

#include <fnmatch.h>

#include <cstdio>
#include <optional>
#include <ostream>
#include <tuple>

#include "common/machine_memory.h"
#include "common/user_error.h"
#include "engine/checkpoint/stage_agreement.h"
#include "engine/hf/hf_model.h"
#include "engine/observe/compute_peak.h"
#include "engine/observe/console_log.h"
#include "engine/observe/cuda_memory_trace.h"
#include "engine/observe/device_peak.h"
#include "engine/observe/memory_tracker.h"
#include "engine/observe/run_summary.h"
#include "engine/train/keys_without_effect.h"
#include "engine/train/parameter_patterns.h"
#include "engine/train/run_folder.h"
#include "kernels/dispatch.h"
#include "layers/sharding.h"
#include "parallel/collective_watchdog.h"
#include "parallel/rank_device.h"

namespace retort::engine {
namespace {

parallel::TransportChoice transport_choice(GpuTransport key) {
  switch (key) {
    case GpuTransport::nccl:
      return parallel::TransportChoice::nccl;
    case GpuTransport::host_staged:
      return parallel::TransportChoice::host_staged;
    case GpuTransport::automatic:
      break;
  }
  return parallel::TransportChoice::automatic;
}

// The teacher.* sizes given in the config against the teacher's own description at `path`.
void require_teacher_sizes(const TeacherKeys& keys, const layers::ModelConfig& stored,
                           const std::string& path) {
  for (const auto& [key, given, held] :
       std::initializer_list<std::tuple<const char*, int64_t, int64_t>>{
           {"teacher.hidden", keys.hidden, stored.hidden},
           {"teacher.layers", keys.layers, stored.layers},
           {"teacher.heads", keys.heads, stored.heads},
           {"teacher.kv_heads", keys.kv_heads, stored.kv_heads},
           {"teacher.ffn_hidden", keys.ffn_hidden, stored.ffn_hidden},
           {"teacher.head_dim", keys.head_dim, stored.head_dim()}})
    if (given > 0 && given != held)
      throw UserError(std::string(key) + "=" + std::to_string(given) + ", but the teacher at '" +
                      path + "' has " + std::to_string(held) +
                      " (leave the teacher's sizes out to take its own)");
}

class TrainerBuilder {
 public:
  TrainerBuilder(const TrainConfig& config, std::ostream* log, parallel::Mesh& mesh)
      : config_(config),
        log_(log),
        console_(log, false),
        mesh_(mesh),
        precision_(precision_policy(config)),
        dtype_(scalar_type_of(precision_.main)),
        compute_dtype_(scalar_type_of(precision_.compute)),
        residual_dtype_(scalar_type_of(precision_.residual)),
        run_(std::make_unique<layers::RunContext>()) {}
  TrainerParts build();

 private:
  void report_transports(const std::vector<std::string>& groups);
  void initialise_student();
  void build_distiller();
  void finish_resume(const std::string& path);
  int64_t head_weight_index() const;
  void log_line(const std::string& line) { console_.line(line); }

  const TrainConfig& config_;
  std::ostream* log_;
  ConsoleLog console_;
  parallel::Mesh& mesh_;
  layers::TensorParallel tp_;
  PrecisionPolicy precision_;
  torch::ScalarType dtype_, compute_dtype_, residual_dtype_;
  torch::Device device_ = torch::kCPU;
  std::unique_ptr<layers::RunContext> run_;
  std::unique_ptr<layers::ParameterStore> store_;
  std::unique_ptr<layers::LlamaModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<distill::Teacher> teacher_;
  std::unique_ptr<distill::Distiller> distiller_;
  std::unique_ptr<GradientSync> sync_;
  int64_t shared_gradient_bytes_ = 0;
  std::unique_ptr<StageStep> stage_step_;
  std::unique_ptr<layers::ActivationOffloader> offloader_;
  HeadGradient head_gradient_ = HeadGradient::none;
  std::unique_ptr<HeadRowStepper> head_stepper_;
  std::unique_ptr<GradReadyHooks> gradient_accounting_;
  SampleStreams streams_;
  TrainingProgress progress_;
  double flops_per_token_ = 0, peak_gflops_ = 0;
  std::string peak_how_;
};

TrainerParts TrainerBuilder::build() {
  // This run's kernel mode and compute copies, shared by its model, teacher and distiller and
  // by nothing else in the process (layers/run_context.h).
  run_->mode = kernels::kernel_mode_for(config_.runtime.kernels == KernelChoice::aten
                                            ? kernels::KernelMode::aten
                                            : kernels::KernelMode::automatic);
  run_->copies.set_kept(config_.memory.keep_compute_weights);
  MemoryTracker& memory = MemoryTracker::install();  // before the first parameter
  parallel::set_collective_timeout(config_.runtime.collective_timeout_s);
  device_ = parallel::rank_device(config_.runtime.device == Device::cuda, mesh_.local_rank(),
                                  int(config_.runtime.gpus_per_node), "runtime.device=cuda");
  const int gpu = device_.is_cuda() ? device_.index() : -1;
  if (device_.is_cuda()) attach_cuda_memory_trace();  // GPU memory in the same account
  report_transports(mesh_.choose_transports(transport_choice(config_.parallel.gpu_transport), gpu));
  if (config_.parallel.p2p_rules == P2pRules::nccl)
    mesh_.pp().set_point_to_point_rules(parallel::PointToPointRules::nccl);
  const parallel::Layout& layout = config_.layout;
  // A run the machine plainly cannot hold stops here, not in the kernel's out-of-memory killer
  // or in an allocation deep inside the first step.
  run_agreed_over(&mesh_.world(), [&] {
    const int ranks_here = mesh_.ranks_on_host();
    if (device_.is_cpu())
      require_memory(estimate_memory(config_).total(), ranks_here,
                     "this run (the memory estimate engine_train --dry-run prints)");
  });
  tp_.group = &mesh_.tp();
  tp_.sequence_parallel = layout.sequence_parallel && layout.tensor > 1;
  const int stage_index = mesh_.coordinates().pp;
  layers::ModelStage stage;
  if (!config_.stages.empty()) {
    const parallel::LayerRange& layers = config_.stages.at(stage_index);
    stage = {layers.first, layers.end, stage_index == 0, stage_index == layout.pipeline - 1};
  }
  {
    MemoryScope parameters(MemoryCategory::parameters);
    store_ =
        std::make_unique<layers::ParameterStore>(config_.seed, dtype_, tp_.position(), device_);
    store_->set_lr_scale_rule(
        [policy = config_.params](const std::string& name) { return policy.lr_scale(name); });
    model_ = std::make_unique<layers::LlamaModel>(config_.model, *store_, tp_, stage);
  }
  model_->set_kernels(
      {config_.memory.fused_kernels, config_.memory.attention_block_rows, true, run_.get()});
  initialise_student();
  check_parameter_patterns(config_.params, *store_, mesh_.pp(), log_);
  build_distiller();
  const layers::MemoryConfig& memory_config = config_.memory;
  if (memory_config.activation_offloading)
    offloader_ = std::make_unique<layers::ActivationOffloader>();
  model_->set_recompute({memory_config.activation_checkpointing, offloader_.get()});
  model_->set_head_chunk_tokens(memory_config.head_chunk_tokens);
  model_->set_defer_head_gradient(memory_config.defer_head_gradient);
  model_->set_types(compute_dtype_, residual_dtype_);
  // Gradients are allocated inside backward as temporaries; once accumulated they count as
  // gradients (hooked before the gradient sync, which may free them).
  gradient_accounting_ =
      std::make_unique<GradReadyHooks>(*store_, [store = store_.get(), &memory](size_t k) {
        memory.retag(store->all()[k].value.grad(), MemoryCategory::gradients);
      });
  GradSyncOptions sync;
  sync.bucket_bytes = static_cast<int64_t>(config_.parallel.dp_bucket_mb * 1e6);
  // The shared-memory sum reads host memory: GPU gradients go through the group's transport.
  sync.shared_memory = config_.parallel.dp_shared_memory && device_.is_cpu();
  if (precision_.dp_gradient_sum != precision_.main)
    sync.reduce_dtype = scalar_type_of(precision_.dp_gradient_sum);
  sync.zero = config_.optimizer.zero_stage == 1;
  sync.tied_embeddings = config_.model.tied_embeddings;
  sync.complete_in_backward = config_.optimizer.in_backward;
  const int64_t head_index = head_weight_index();
  HeadGradientFacts head_facts;
  head_facts.embedding_here = model_->stage().embedding;
  head_facts.head_here = head_index >= 0;
  head_facts.dp_size = mesh_.gradient_reduction().size();
  head_facts.head_frozen = head_index >= 0 && store_->all()[size_t(head_index)].spec.frozen();
  head_gradient_ = resolve_head_gradient(config_, head_facts);
  const int64_t streamed_head = streams_to_stepper(head_gradient_) ? head_index : -1;
  if (streamed_head >= 0) sync.streamed.push_back(size_t(streamed_head));
  sync.gradient_offers = &run_->gradients;
  sync_ = std::make_unique<GradientSync>(*store_, mesh_, tp_, sync);
  {
    MemoryScope state(MemoryCategory::optimizer_state);
    optimizer_ = std::make_unique<AdamW>(*store_, config_.optimizer,
                                         [sync = sync_.get()](size_t i) { return sync->owns(i); });
  }
  stage_step_ = std::make_unique<StageStep>(
      StageModels{model_.get(), teacher_.get(), distiller_.get()}, tp_, config_.data.seq_len,
      scalar_type_of(precision_.pipeline_message));
  if (streamed_head >= 0) {
    HeadRowStepOptions options;
    options.index = size_t(streamed_head);
    options.tied_here = config_.model.tied_embeddings;  // and so on this stage
    options.vocab_start = tp_.rank() * store_->all()[options.index].value.size(0);
    options.owner = sync_->zero() ? sync_->zero()->owner(options.index) : -1;
    options.shared_memory = config_.parallel.dp_shared_memory && device_.is_cpu();
    options.reduce_in_blocks = config_.parallel.dp_head_blocks;
    // Stepping inside backward, or (reduce-only) only reducing it in blocks over DP.
    AdamW* stepping =
        head_gradient_ == HeadGradient::stepped_in_backward ? optimizer_.get() : nullptr;
    head_stepper_ =
        std::make_unique<HeadRowStepper>(*store_, stepping, mesh_.gradient_reduction(), options);
    HeadRowStepper* stepper = head_stepper_.get();
    sync_->set_on_streamed_ready([stepper](size_t) { stepper->complete(); });
    if (!stepping) sync_->set_on_progress([stepper] { stepper->progress(); });
    stage_step_->set_head_grad_sink(head_stepper_.get());
  }
  RunFacts facts;
  facts.on_gpu = device_.is_cuda();
  facts.dp_size = mesh_.gradient_reduction().size();
  facts.dp_sum_in_shared_memory = sync_->reduces_in_shared_memory();
  facts.head_gradient_deferred = head_gradient_ == HeadGradient::tied_deferred;
  if (log_)
    for (const std::string& line : keys_without_effect(config_, facts))
      *log_ << "retort: " << line << "\n";
  // The shared-memory DP segments hold the summed gradients (their .grad() views them).
  shared_gradient_bytes_ =
      sync_->shared_bytes() + (head_stepper_ ? head_stepper_->shared_bytes() : 0);
  memory.add_outside(MemoryCategory::gradients, shared_gradient_bytes_);
  if (log_ && mesh_.gradient_reduction().size() > 1)
    *log_ << "retort: dp gradient sum: " << sync_->describe_dp_sum() << "\n";
  VocabularyLimit vocabulary{config_.model.vocab_size, "model.vocab_size"};
  if (teacher_ && teacher_->config().vocab_size < vocabulary.size)
    vocabulary = {teacher_->config().vocab_size, "the teacher's vocab_size"};
  streams_ = build_sample_streams(config_.data, config_.seed, vocabulary);

  progress_.seed = config_.seed;
  progress_.model_json = model_config_json(config_.model);
  progress_.seq_len = config_.data.seq_len;
  progress_.dtype = enum_name(config_.dtype);

  if (config_.checkpoint.load == "auto") {
    // The newest checkpoint of run.dir that loads (its index.json is there and its checksums
    // hold); a damaged one is reported and the one before it tried, never skipped in silence.
    // None at all: a fresh start.
    std::string path, newest_reason;
    const std::vector<std::string> candidates = checkpoint_folders(config_.run_dir);
    for (const std::string& candidate : candidates) {
      try {
        progress_ = load_checkpoint(candidate, mesh_, *store_, optimizer_.get());
        path = candidate;
        break;
      } catch (const UserError& e) {
        log_line("checkpoint.load=auto: skipping " + candidate + ": " + e.what());
        if (newest_reason.empty()) newest_reason = e.what();
      }
    }
    // The newest one's reason on the error line itself (a shape that does not match, say):
    // the others were logged above.
    if (path.empty() && !candidates.empty())
      throw UserError("checkpoint.load=auto: no checkpoint of '" + config_.run_dir +
                      "' loads; the newest: " + newest_reason +
                      (candidates.size() > 1
                           ? " (" + std::to_string(candidates.size() - 1) + " more on stdout)"
                           : "") +
                      ". Resume it with the config it was trained with, or give this run "
                      "another run.dir");
    if (path.empty())
      log_line("checkpoint.load=auto: no checkpoint in " + config_.run_dir + ", starting fresh");
    else
      finish_resume(path);
  } else if (!config_.checkpoint.load.empty()) {
    const std::string path = resolve_checkpoint(config_.checkpoint.load);
    progress_ = load_checkpoint(path, mesh_, *store_, optimizer_.get());
    finish_resume(path);
  }
  flops_per_token_ = config_.model.training_flops_per_token(config_.data.seq_len);
  if (config_.runtime.peak_gflops > 0) {
    peak_gflops_ = config_.runtime.peak_gflops;
    peak_how_ = "runtime.peak_gflops";
  } else if (device_.is_cuda()) {
    const DevicePeak peak =
        device_compute_peak(device_.index(), precision_.compute == NumberType::bfloat16);
    peak_gflops_ = peak.gflops;
    peak_how_ = peak.how;
  } else {
    const ComputePeak peak = measure_compute_peak(torch::get_num_threads(), mesh_.ranks_on_host());
    peak_gflops_ = peak.gflops;
    peak_how_ = peak.how;
  }
  char line[256];
  std::snprintf(line, sizeof line, "MFU against %.1f GFLOP/s per rank (%s)", peak_gflops_,
                peak_how_.c_str());
  log_line(line);
  TrainerParts parts;
  parts.tp = tp_;
  parts.precision = precision_;
  parts.device = device_;
  parts.run = std::move(run_);
  parts.store = std::move(store_);
  parts.model = std::move(model_);
  parts.optimizer = std::move(optimizer_);
  parts.teacher = std::move(teacher_);
  parts.distiller = std::move(distiller_);
  parts.sync = std::move(sync_);
  parts.shared_gradient_bytes = shared_gradient_bytes_;
  parts.stage_step = std::move(stage_step_);
  parts.offloader = std::move(offloader_);
  parts.head_gradient = head_gradient_;
  parts.head_stepper = std::move(head_stepper_);
  parts.gradient_accounting = std::move(gradient_accounting_);
  parts.streams = std::move(streams_);
  parts.progress = progress_;
  parts.flops_per_token = flops_per_token_;
  parts.peak_gflops = peak_gflops_;
  parts.peak_how = peak_how_;
  return parts;
}

void TrainerBuilder::report_transports(const std::vector<std::string>& groups) {
  if (!log_ || groups.empty()) return;
  *log_ << "retort: groups of rank 0:";
  for (size_t i = 0; i < groups.size(); ++i) *log_ << (i ? "; " : " ") << groups[i];
  *log_ << "\n";
  for (const std::string& line : mesh_.describe_hosts()) *log_ << "retort: " << line << "\n";
  for (const std::string& warning : mesh_.tp_groups_across_hosts())
    *log_ << "retort: warning: " << warning << "\n";
}

void TrainerBuilder::finish_resume(const std::string& path) {
  progress_.model_json = model_config_json(config_.model);
  progress_.seq_len = config_.data.seq_len;
  const std::string dtype = enum_name(config_.dtype);
  if (!progress_.dtype.empty() && progress_.dtype != dtype)
    log_line("warning: checkpoint '" + path + "' was trained in " + progress_.dtype +
             "; this run goes on in " + dtype + " (model.dtype)");
  progress_.dtype = dtype;
  if (progress_.seed != static_cast<uint64_t>(config_.seed))
    throw UserError("checkpoint '" + path + "' was trained with seed " +
                    std::to_string(progress_.seed) + " but the config has seed " +
                    std::to_string(config_.seed) + "; the data order would differ");
  log_line("resumed from " + path + " at step " + std::to_string(progress_.step));
}

void TrainerBuilder::initialise_student() {
  const ParamPolicy& policy = config_.params;
  if (policy.init_from.empty()) return;
  const bool hf = hf::is_hf_model_dir(policy.init_from);
  const std::string path = hf ? policy.init_from : resolve_checkpoint(policy.init_from);
  if (hf)  // a Hugging Face directory; its shapes must be the student's
    hf::load_hf_parameters(path, hf::read_hf_config(path), *store_, tp_);
  else
    load_checkpoint(path, mesh_, *store_, nullptr);  // parameters only, strictly
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
  mesh_.pp().all_reduce(matched);
  for (size_t i = 0; i < policy.init_reset.size(); ++i)
    if (matched[i].item<int64_t>() == 0)
      throw UserError("model.init.reset: pattern '" + policy.init_reset[i] +
                      "' matches no parameter");
  reset = matched[-1].item<int64_t>();
  log_line("initialised from " + path + " (" + std::to_string(reset) + " parameters reset)");
}

void TrainerBuilder::build_distiller() {
  const DistillSettings& settings = config_.distill;
  if (!settings.enabled) return;
  layers::ModelConfig teacher_model = settings.teacher;
  std::string teacher_path;
  const bool hf_teacher = hf::is_hf_model_dir(settings.keys.checkpoint);
  if (!settings.keys.checkpoint.empty()) {
    teacher_path =
        hf_teacher ? settings.keys.checkpoint : resolve_checkpoint(settings.keys.checkpoint);
    // The teacher's own description (a Hugging Face directory's config.json, or the
    // checkpoint's) decides everything about it, its RoPE scaling included; teacher.* sizes,
    // where given, must agree with it.
    const std::optional<layers::ModelConfig> stored =
        hf_teacher ? std::optional<layers::ModelConfig>(hf::read_hf_config(teacher_path))
                   : read_checkpoint_model(teacher_path);
    if (stored) {
      require_teacher_sizes(settings.keys, *stored, teacher_path);
      teacher_model = *stored;
    }
    const parallel::Layout& layout = config_.layout;
    parallel::resolve_layout(
        layout, layout.tensor * layout.pipeline * layout.data,
        {teacher_model.heads, teacher_model.kv_heads, teacher_model.ffn_hidden,
         std::max<int64_t>(teacher_model.layers, layout.pipeline), config_.data.seq_len});
  }
  if (settings.objective.logits.teacher_top_k > teacher_model.vocab_size)
    throw UserError(
        "distill.teacher_top_k=" + std::to_string(settings.objective.logits.teacher_top_k) +
        " is above the teacher's vocabulary (" + std::to_string(teacher_model.vocab_size) + ")");
  distill::DistillConfig objective = settings.objective;
  objective.pairs =
      distill::make_activation_pairs(objective.pair_names, objective.every_layer_points,
                                     config_.model.layers, teacher_model.layers);
  const std::vector<distill::ActivationPair>& pairs = objective.pairs;
  // Under pipeline parallelism the teacher's layers are split so that each pair's teacher
  // layer runs on the stage of its student layer (its hidden state travels with the student's).
  layers::ModelStage teacher_stage;
  if (config_.layout.pipeline > 1) {
    std::vector<std::pair<int, int64_t>> pins;
    if (objective.activation_weight > 0)
      for (const distill::ActivationPair& pair : pairs)
        pins.emplace_back(
            parallel::stage_of_layer(config_.stages, layers::capture_layer(pair.student)),
            layers::capture_layer(pair.teacher));
    const parallel::LayerRange teacher_layers = parallel::split_layers_pinned(
        teacher_model.layers, config_.layout.pipeline, pins)[mesh_.coordinates().pp];
    teacher_stage = {teacher_layers.first, teacher_layers.end, model_->stage().embedding,
                     model_->stage().head};
  }
  {
    MemoryScope weights(MemoryCategory::teacher_weights);
    teacher_ = std::make_unique<distill::Teacher>(teacher_model, settings.keys.seed, compute_dtype_,
                                                  tp_, teacher_stage, device_);
  }
  teacher_->set_residual_type(residual_dtype_);
  teacher_->set_run(run_.get());
  if (hf_teacher)
    hf::load_hf_parameters(teacher_path, teacher_model, teacher_->parameters(), tp_);
  else if (!teacher_path.empty())
    load_checkpoint(teacher_path, mesh_, teacher_->parameters(), nullptr);
  MemoryScope projections(MemoryCategory::parameters);
  distiller_ = std::make_unique<distill::Distiller>(objective, *teacher_, config_.model, *store_,
                                                    tp_, model_->stage());
  distiller_->set_kernels(model_->kernels());
}

int64_t TrainerBuilder::head_weight_index() const {
  if (!model_->stage().head) return -1;
  const std::vector<layers::Parameter>& all = store_->all();
  for (size_t k = 0; k < all.size(); ++k)
    if (all[k].value.is_same(model_->head_weight())) return int64_t(k);
  return -1;
}

}  // namespace

torch::ScalarType scalar_type_of(NumberType type) {
  switch (type) {
    case NumberType::float64:
      return torch::kDouble;
    case NumberType::bfloat16:
      return torch::kBFloat16;
    case NumberType::float32:
      break;
  }
  return torch::kFloat;
}

TrainerParts build_trainer_parts(const TrainConfig& config, std::ostream* log,
                                 parallel::Mesh& mesh) {
  return TrainerBuilder(config, log, mesh).build();
}

}  // namespace retort::engine
