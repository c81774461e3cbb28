// engine/train/trainer.cpp: see trainer.h.
#include "engine/train/trainer.h"

#include <fnmatch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <ostream>

#include "common/fault_injection.h"
#include "common/machine_memory.h"
#include "common/make_directories.h"
#include "common/resident_memory.h"
#include "common/trace_span.h"
#include "common/user_error.h"
#include "engine/checkpoint/stage_agreement.h"
#include "engine/data/batches.h"
#include "engine/hf/hf_model.h"
#include "engine/observe/chrome_trace.h"
#include "engine/observe/compute_peak.h"
#include "engine/observe/cuda_memory_trace.h"
#include "engine/observe/device_peak.h"
#include "engine/observe/memory_tracker.h"
#include "engine/observe/metrics.h"
#include "engine/observe/run_summary.h"
#include "engine/train/head_gradient.h"
#include "engine/train/keys_without_effect.h"
#include "engine/train/parameter_patterns.h"
#include "engine/train/run_folder.h"
#include "engine/train/stop_signal.h"
#include "kernels/dispatch.h"
#include "layers/compute_copy.h"
#include "layers/sharding.h"
#include "parallel/communicator.h"
#include "parallel/rank_device.h"

namespace retort::engine {
namespace fs = std::filesystem;
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

torch::Tensor to_tensor(const std::vector<int64_t>& values, int64_t batch) {
  return torch::tensor(values, torch::kLong).view({batch, -1});
}

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

}  // namespace

torch::Tensor Trainer::placed(const torch::Tensor& host) const {
  if (device_.is_cpu()) return host;
  // Through pinned memory, without waiting: the copy is queued before the step's kernels.
  return host.pin_memory().to(device_, /*non_blocking=*/true);
}

void Trainer::report_transports(const std::vector<std::string>& groups) {
  if (!log_ || groups.empty()) return;
  *log_ << "retort: groups of rank 0:";
  for (size_t i = 0; i < groups.size(); ++i) *log_ << (i ? "; " : " ") << groups[i];
  *log_ << "\n";
  for (const std::string& line : mesh_.describe_hosts()) *log_ << "retort: " << line << "\n";
  for (const std::string& warning : mesh_.tp_groups_across_hosts())
    *log_ << "retort: warning: " << warning << "\n";
}

Trainer::Trainer(const TrainConfig& config, std::ostream* log)
    : Trainer(config, log, parallel::Mesh::single_process(), nullptr) {}

Trainer::Trainer(const TrainConfig& config, std::ostream* log, parallel::Mesh& mesh)
    : Trainer(config, log, nullptr, &mesh) {}

Trainer::Trainer(const TrainConfig& config, std::ostream* log,
                 std::unique_ptr<parallel::Mesh> own_mesh, parallel::Mesh* mesh)
    : config_(config),
      log_(log),
      console_(log, false),
      own_mesh_(std::move(own_mesh)),
      mesh_(mesh ? *mesh : *own_mesh_),
      precision_(precision_policy(config)),
      dtype_(scalar_type_of(precision_.main)),
      compute_dtype_(scalar_type_of(precision_.compute)),
      residual_dtype_(scalar_type_of(precision_.residual)),
      run_(std::make_unique<layers::RunContext>()) {
  // This run's kernel mode and compute copies, shared by its model, teacher and distiller and
  // by nothing else in the process (layers/run_context.h).
  run_->mode = kernels::kernel_mode_for(config.runtime.kernels == KernelChoice::aten
                                            ? kernels::KernelMode::aten
                                            : kernels::KernelMode::automatic);
  run_->copies.set_kept(config.memory.keep_compute_weights);
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
  if (own_mesh_ && layout.tensor * layout.pipeline * layout.data != 1)
    throw UserError("layout " + parallel::describe(layout) + " needs MPI ranks");
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
        [this](const std::string& name) { return config_.params.lr_scale(name); });
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
  gradient_accounting_ = std::make_unique<GradReadyHooks>(*store_, [this, &memory](size_t k) {
    memory.retag(store_->all()[k].value.grad(), MemoryCategory::gradients);
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
                                         [this](size_t i) { return sync_->owns(i); });
  }
  if (config_.optimizer.in_backward) sync_->set_on_final([this](size_t k) { step_in_backward(k); });
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
    sync_->set_on_streamed_ready([this](size_t) { head_stepper_->complete(); });
    if (!stepping) sync_->set_on_progress([this] { head_stepper_->progress(); });
    stage_step_->set_head_grad_sink(head_stepper_.get());
  }
  // The parameter the gradient faults act on, found once (every parameter exists by now).
  for (size_t k = 0; k < store_->all().size(); ++k)
    if (fault_parameter_ < 0 && store_->all()[k].spec.name == kFaultParameter)
      fault_parameter_ = int64_t(k);
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
}

Trainer::~Trainer() {
  MemoryTracker::install().add_outside(MemoryCategory::gradients, -shared_gradient_bytes_);
  // The 16-bit copies of this trainer's weights go with its run context.
}

void Trainer::finish_resume(const std::string& path) {
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

void Trainer::initialise_student() {
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

void Trainer::build_distiller() {
  const DistillSettings& settings = config_.distill;
  if (!settings.enabled) return;
  layers::ModelConfig teacher_model = settings.teacher;
  std::string teacher_path;
  const bool hf_teacher = hf::is_hf_model_dir(settings.keys.checkpoint);
  if (!settings.keys.checkpoint.empty()) {
    teacher_path =
        hf_teacher ? settings.keys.checkpoint : resolve_checkpoint(settings.keys.checkpoint);
    // Without explicit teacher sizes, the checkpoint's own model description decides (a
    // Hugging Face directory's config.json).
    if (hf_teacher && !settings.teacher_shape_given)
      teacher_model = hf::read_hf_config(teacher_path);
    else if (!settings.teacher_shape_given)
      if (auto stored = read_checkpoint_model(teacher_path)) teacher_model = *stored;
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
    teacher_stage = {teacher_layers.first, teacher_layers.end, stage().embedding, stage().head};
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
                                                    tp_, stage());
  distiller_->set_kernels(model_->kernels());
}

void Trainer::log_line(const std::string& line) {
  console_.line(line);
}

void Trainer::agree_on_step(StepResult& result) {
  // One all-reduce of the world per step: whether any rank saw a non-finite loss or gradient
  // norm (a NaN in a replicated parameter's gradient on one TP rank enters only that rank's
  // norm), and whether any rank received a stop signal.
  torch::Tensor flags =
      torch::tensor({std::isfinite(result.loss) ? 0.0 : 1.0,
                     std::isfinite(result.grad_norm) ? 0.0 : 1.0, double(stop_signal_received())},
                    torch::kDouble);
  mesh_.world().all_reduce(flags, parallel::ReduceOp::Max);
  // Every rank reports the same verdict: a value non-finite elsewhere reads NaN here.
  if (flags[0].item<double>() > 0 && std::isfinite(result.loss)) result.loss = std::nan("");
  if (flags[1].item<double>() > 0 && std::isfinite(result.grad_norm))
    result.grad_norm = std::nan("");
  result.skipped = !std::isfinite(result.loss) || !std::isfinite(result.grad_norm);
  result.stop_signal = int(flags[2].item<double>());
  result.stop_requested = result.stop_signal != 0;
}

double Trainer::dp_sum(double value) {
  if (mesh_.gradient_reduction().size() == 1) return value;
  torch::Tensor t = torch::tensor({value}, torch::kDouble);
  mesh_.gradient_reduction().all_reduce(t);
  return t.item<double>();
}

void Trainer::sum_over_ranks(StepResult& result) {
  // Each stage computed its own parts, each DP rank its own samples. One all-reduce per
  // group: the loss, and its parts when distilling (LM-only steps send one scalar).
  for (parallel::Communicator* group : {&mesh_.pp(), &mesh_.gradient_reduction()}) {
    if (group->size() == 1) continue;
    std::vector<double> values = {result.loss};
    if (distiller_) {
      const std::vector<double> parts = result.terms.values();
      values.insert(values.end(), parts.begin(), parts.end());
    }
    torch::Tensor t = torch::tensor(values, torch::kDouble);
    group->all_reduce(t);
    values.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    result.loss = values[0];
    if (distiller_) result.terms.assign_values({values.begin() + 1, values.end()});
  }
  if (!distiller_) result.terms.lm = result.loss;
}

std::vector<MicroBatch> Trainer::read_micro_batches(double& target_count) {
  const TrainingConfig& training = config_.training;
  const parallel::DataSplit split = mesh_.data_split();
  BatchPlan plan(training.global_batch, training.micro_batch, split.count, split.index);
  std::vector<MicroBatch> micro;
  int64_t local_targets = 0;
  for (int64_t m = 0; m < plan.micro_batches_per_step(); ++m) {
    const int64_t first = plan.first_sample(progress_.step, m);
    const TokenBatch batch = read_batch(*streams_.train, first, training.micro_batch);
    const torch::Tensor tokens = to_tensor(batch.inputs, batch.batch);
    micro.push_back({placed(tokens), placed(to_tensor(batch.targets, batch.batch)),
                     first - progress_.step * training.global_batch, tokens});
    local_targets += int64_t(batch.targets.size());  // no padding: every target counts
  }
  // Losses are normalised by the target count of the whole global batch.
  target_count = dp_sum(double(local_targets));
  return micro;
}

int64_t Trainer::head_weight_index() const {
  if (!model_->stage().head) return -1;
  const std::vector<layers::Parameter>& all = store_->all();
  for (size_t k = 0; k < all.size(); ++k)
    if (all[k].value.is_same(model_->head_weight())) return int64_t(k);
  return -1;
}

void Trainer::step_in_backward(size_t k) {
  layers::Parameter& p = store_->all()[k];
  grad_squares_[k] = grad_square(p);
  optimizer_->step_parameter(k, step_lr_);
  p.value.mutable_grad().reset();
}

void Trainer::clear_gradients() {
  for (auto& p : store_->all())
    if (p.value.grad().defined()) p.value.mutable_grad().reset();
}

StepResult Trainer::train_step() {
  using clock = std::chrono::steady_clock;
  StepResult result;
  result.step = progress_.step + 1;
  TraceSpan step_span([&] { return "retort step " + std::to_string(result.step); });
  double target_count = 0;
  const std::vector<MicroBatch> micro = read_micro_batches(target_count);
  clear_gradients();
  sync_->offer_gradient_memory();  // the DP sum's shared region, where it has one
  // The schedule follows optimizer steps taken: a skipped step does not advance it.
  result.lr = config_.optimizer.schedule.at(optimizer_->steps());
  const bool in_backward = config_.optimizer.in_backward;
  if (in_backward) {  // parameters step as GradientSync reports them final
    optimizer_->begin_step();
    step_lr_ = result.lr;
    grad_squares_.assign(store_->all().size(), torch::Tensor());
  }
  if (head_stepper_) {
    std::vector<torch::Tensor> tokens;
    for (const MicroBatch& b : micro) tokens.push_back(b.host_tokens);  // host-side bookkeeping
    head_stepper_->begin_step(tokens, result.lr);
  }
  if (distiller_ && distiller_->uses_activations())  // every stage reports every pair
    for (const distill::ActivationPair& pair : distiller_->pairs())
      result.terms.per_pair[pair.student] = 0;
  distill::PendingTerms pending;  // the step's scalars, read to the host once below
  stage_step_->train(mesh_.pp(), micro, target_count, result.step, *sync_, inspector_, pending,
                     result.times);

  auto start = clock::now();
  TraceSpan sync_span([] { return "retort gradient sync"; });
  sync_->finish();
  if (fault_parameter_ >= 0) {  // the consistency suite's self-test only
    layers::Parameter& p = store_->all()[size_t(fault_parameter_)];
    if (p.value.grad().defined() && fault_injected(Fault::GradScaled))
      p.value.mutable_grad().mul_(1 + 1e-3);
    if (p.value.grad().defined() && fault_injected(Fault::GradMissing))
      p.value.mutable_grad().reset();
  }
  // The gradient norm's square, reduced on the gradients' device.
  auto grad_square = [&] {
    if (in_backward && head_stepper_)
      grad_squares_[head_stepper_->index()] = head_stepper_->grad_square();
    return in_backward
               ? grad_square_sum(*store_, grad_squares_, tp_, sync_->sharded_over(), &mesh_.pp())
               : global_grad_square_sum(*store_, tp_, sync_->sharded_over(), &mesh_.pp());
  };
  // Read with the loss and its terms in the step's one transfer to the host; except that an
  // inspector's on_gradients (tests, the consistency suite) sees the loss and may change the
  // gradients before the norm, which then takes a read of its own.
  const bool inspecting = inspector_ && inspector_->on_gradients;
  if (!inspecting) pending.add_value("grad_square", grad_square());
  const std::map<std::string, double> read = pending.settle_into(result.terms);
  result.loss = read.count("loss") ? read.at("loss") : 0.0;
  sum_over_ranks(result);
  result.times.sync_s = seconds_since(start);
  sync_span.end();
  if (inspecting) inspector_->on_gradients(result);

  start = clock::now();
  result.grad_norm = std::sqrt(inspecting ? grad_square().item<double>() : read.at("grad_square"));
  agree_on_step(result);
  TraceSpan optimizer_span([] { return "retort optimizer"; });
  if (result.skipped) {
    if (in_backward)
      throw AgreedStop(
          "step " + std::to_string(result.step) +
          ": non-finite loss or gradient norm with optimizer.in_backward=true; the parameters "
          "were already updated during backward, so the step cannot be skipped. The run stops; "
          "its checkpoints are kept (resume from the last one, e.g. with optimizer.in_backward="
          "false and training.max_skipped_steps)");
    clear_gradients();
    result.times.optimizer_s = seconds_since(start);
    progress_.step += 1;  // the data moves past the bad batch; the schedule does not
    progress_.consumed_samples += config_.training.global_batch;
    if (inspector_ && inspector_->on_step_end) inspector_->on_step_end(result);
    return result;
  }
  if (!in_backward) {
    scale_to_norm(*store_, result.grad_norm, config_.optimizer.grad_clip);
    optimizer_->step(result.lr);
  }
  if (ZeroPartition* zero = sync_->zero()) zero->all_gather_parameters(*store_);
  result.times.optimizer_s = seconds_since(start);
  progress_.step += 1;
  progress_.consumed_samples += config_.training.global_batch;
  if (inspector_ && inspector_->on_step_end) inspector_->on_step_end(result);
  return result;
}

double Trainer::evaluate() {
  if (!streams_.valid) return std::nan("");
  const TrainingConfig& training = config_.training;
  const int64_t samples = training.eval_batches * training.global_batch;
  // Micro-batches are dealt round-robin to DP ranks; sums and counts are then combined.
  const parallel::DataSplit split = mesh_.data_split();
  std::vector<MicroBatch> mine;
  double count = 0;
  int64_t index = 0;
  for (int64_t first = 0; first < samples; first += training.micro_batch, ++index) {
    if (index % split.count != split.index) continue;
    const TokenBatch b =
        read_batch(*streams_.valid, first, std::min(training.micro_batch, samples - first));
    const torch::Tensor targets = to_tensor(b.targets, b.batch);
    count += double(layers::count_targets(targets));
    mine.push_back({placed(to_tensor(b.inputs, b.batch)), placed(targets), first});
  }
  // On the last stage; 0 on the others.
  torch::Tensor loss_sum = torch::tensor({stage_step_->evaluate(mesh_.pp(), mine)}, torch::kDouble);
  mesh_.pp().all_reduce(loss_sum);
  return dp_sum(loss_sum.item<double>()) / dp_sum(count);
}

void Trainer::save(const std::string& path) {
  save_checkpoint(path, mesh_, *store_, optimizer_.get(), sync_->zero(), progress_);
  if (is_root()) prune_checkpoints(config_.run_dir, config_.checkpoint.keep_last);
  log_line("saved checkpoint " + path);
}

void Trainer::write_metrics(const StepResult& result, double seconds, double comm_seconds,
                            int64_t steps_in_interval, MetricsFile* metrics_file,
                            TensorBoardWriter* events) {
  const TrainingConfig& training = config_.training;
  StepMetrics metrics;
  metrics.step = result.step;
  metrics.total_steps = training.steps;
  metrics.loss = result.loss;
  metrics.lr = result.lr;
  metrics.grad_norm = result.grad_norm;
  metrics.tokens_per_s =
      double(steps_in_interval * training.global_batch * config_.data.seq_len) / seconds;
  metrics.mfu =
      metrics.tokens_per_s * flops_per_token_ / (peak_gflops_ * 1e9 * mesh_.world().size());
  metrics.exposed_comm_s = comm_seconds / double(steps_in_interval);
  MemoryTracker& memory = MemoryTracker::install();
  metrics.peak_mem_bytes = memory.peak_bytes();
  const MemorySplit split = memory.peak_split();
  for (int c = 0; c < kMemoryCategories; ++c)
    if (MemoryCategory(c) != MemoryCategory::offloaded)
      metrics.peak_by_category[enum_name(MemoryCategory(c))] = split.bytes[c];
  metrics.peak_by_category["offloaded_host_peak"] = memory.peak_offloaded_bytes();
  memory.reset_peak();
  const ResidentMemory resident = read_resident_memory();
  metrics.resident_bytes = resident.resident_bytes;
  metrics.huge_page_bytes = resident.huge_page_bytes;
  metrics.eta_s = seconds / double(steps_in_interval) * double(training.steps - result.step);
  const bool eval_now = training.eval_every > 0 &&
                        (result.step % training.eval_every == 0 || result.step == training.steps);
  if (eval_now && streams_.valid) metrics.valid_loss = evaluate();
  if (distiller_) {
    metrics.parts["lm_loss"] = result.terms.lm;
    metrics.parts["logit_loss"] = result.terms.logits;
    metrics.parts["activation_loss"] = result.terms.activations;
    for (const auto& [name, value] : result.terms.per_pair)
      metrics.parts["activation_loss." + name] = value;
  }
  log_line(format_console_line(metrics));
  if (metrics_file) metrics_file->write(metrics);
  if (events) events->write_scalars(metrics.step, metric_scalars(metrics));
}

void Trainer::show_progress(const StepResult& result, double seconds) {
  if (!console_.terminal()) return;
  const TrainingConfig& training = config_.training;
  StepMetrics metrics;
  metrics.step = result.step;
  metrics.total_steps = training.steps;
  metrics.loss = result.loss;
  metrics.tokens_per_s = double(training.global_batch * config_.data.seq_len) / seconds;
  metrics.mfu =
      metrics.tokens_per_s * flops_per_token_ / (peak_gflops_ * 1e9 * mesh_.world().size());
  metrics.eta_s = seconds * double(training.steps - result.step);
  console_.progress(format_progress_line(metrics));
}

std::vector<StepResult> Trainer::run() {
  const TrainingConfig& training = config_.training;
  std::unique_ptr<MetricsFile> metrics;
  std::unique_ptr<TensorBoardWriter> events;
  try {  // a run folder that cannot be made stops every rank with the root's one line
    run_agreed_over(&mesh_.world(), [&] {
      if (!is_root()) return;
      // Before anything is written: run.dir holds no other run this one would write over.
      claim_run_folder(config_.run_dir, config_.checkpoint.load, config_.overwrite, log_);
      make_directories(config_.run_dir);
      metrics =
          std::make_unique<MetricsFile>((fs::path(config_.run_dir) / "metrics.jsonl").string());
      if (config_.logging.tensorboard)
        events = std::make_unique<TensorBoardWriter>(config_.run_dir);
    });
  } catch (const UserError& e) {
    throw AgreedStop(e.what(), 2);
  }
  MemoryTracker::install();
  std::vector<StepResult> results;
  if (progress_.step >= training.steps) {
    log_line("nothing to do: already at step " + std::to_string(progress_.step) + " of " +
             std::to_string(training.steps));
    return results;
  }
  using clock = std::chrono::steady_clock;
  auto interval_start = clock::now();
  double interval_comm_start = parallel::exposed_communication_seconds();
  int64_t interval_steps = 0;
  const std::vector<int64_t>& profile = config_.logging.profile_steps;
  if (!profile.empty() && progress_.step + 1 > profile[0])
    log_line("warning: logging.profile_steps = [" + std::to_string(profile[0]) + ", " +
             std::to_string(profile[1]) + "] starts before step " +
             std::to_string(progress_.step + 1) +
             ", where this run resumes; no trace will be written");
  ChromeTrace trace;
  while (progress_.step < training.steps) {
    if (!profile.empty() && progress_.step + 1 == profile[0]) trace.start();
    const auto step_start = clock::now();
    results.push_back(train_step());
    show_progress(results.back(), seconds_since(step_start));
    if (trace.running() && (progress_.step >= profile[1] || progress_.step >= training.steps)) {
      const std::string path =
          trace.stop_and_write((fs::path(config_.run_dir) / "trace").string(), mesh_.world());
      if (!path.empty())
        log_line("wrote the Chrome trace of steps " + std::to_string(profile[0]) + "-" +
                 std::to_string(progress_.step) + " to " + path);
    }
    ++interval_steps;
    const int64_t step = progress_.step;
    const StepResult& last = results.back();
    if (last.skipped) {
      ++skipped_steps_;
      ++consecutive_skips_;
      char text[160];
      std::snprintf(text, sizeof(text),
                    "step %lld skipped: non-finite %s (loss %g, grad norm %g); %lld in a row, "
                    "limit training.max_skipped_steps=%lld",
                    (long long)step, std::isfinite(last.loss) ? "gradient norm" : "loss", last.loss,
                    last.grad_norm, (long long)consecutive_skips_,
                    (long long)training.max_skipped_steps);
      log_line(text);
      if (metrics) metrics->write_skipped(step, last.loss, last.grad_norm, skipped_steps_);
      if (consecutive_skips_ >= training.max_skipped_steps)
        throw AgreedStop("stopping at step " + std::to_string(step) + ": " +
                         std::to_string(consecutive_skips_) +
                         " consecutive steps had a non-finite loss or gradient norm "
                         "(training.max_skipped_steps=" +
                         std::to_string(training.max_skipped_steps) +
                         "); no checkpoint was written for them, the last saved one is kept");
    } else {
      consecutive_skips_ = 0;
    }
    const bool eval_now =
        training.eval_every > 0 && (step % training.eval_every == 0 || step == training.steps);
    if (step % training.log_every == 0 || step == training.steps || eval_now) {
      write_metrics(results.back(), seconds_since(interval_start),
                    parallel::exposed_communication_seconds() - interval_comm_start, interval_steps,
                    metrics.get(), events.get());
      interval_start = clock::now();
      interval_comm_start = parallel::exposed_communication_seconds();
      interval_steps = 0;
    }
    // Not during a streak of skipped steps: the newest checkpoint stays the last good step's.
    const bool save_now =
        !last.skipped &&
        ((config_.checkpoint.save_every > 0 && step % config_.checkpoint.save_every == 0) ||
         (step == training.steps && config_.checkpoint.save_at_end));
    if (save_now) save(checkpoint_path(config_.run_dir, step));
    if (last.stop_requested) {
      // Pre-emption: every rank agreed at this step, so every rank saves it and ends.
      if (!save_now) save(checkpoint_path(config_.run_dir, step));
      log_line(std::string("stopped by ") + stop_signal_name(last.stop_signal) + " at step " +
               std::to_string(step) + " of " + std::to_string(training.steps) +
               "; resume with checkpoint.load=auto (or the checkpoint above)");
      break;
    }
  }
  return results;
}

}  // namespace retort::engine
