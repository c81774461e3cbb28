// engine/train/trainer_builder.cpp: see trainer_builder.h. The builder's members carry the
// names of the Trainer's that they become.
#include "engine/train/trainer_builder.h"

#include <fnmatch.h>

#include <cstdio>
#include <filesystem>
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
#include "engine/teacher_cache/cache_fingerprint.h"
#include "engine/train/keys_without_effect.h"
#include "engine/train/parameter_patterns.h"
#include "engine/train/run_folder.h"
#include "engine/train/tokenizer_identity.h"
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
        residual_dtype_(scalar_type_of(precision_.residual)) {
    parts_.run = std::make_unique<layers::RunContext>();
  }
  TrainerParts build();

 private:
  void report_transports(const std::vector<std::string>& groups);
  void initialise_student();
  // The teacher's shape and source (its own description where it has one): teacher_model_.
  void resolve_teacher();
  // The student's tokenizer, from data.tokenizer and model.init.from, which must agree.
  void settle_student_tokenizer();
  void build_distiller();
  // teacher.cache opened and checked against this run: parts_.cached_teacher.
  void open_teacher_cache();
  void finish_resume(const std::string& path);
  int64_t head_weight_index() const;
  void log_line(const std::string& line) { console_.line(line); }

  const TrainConfig& config_;
  std::ostream* log_;
  ConsoleLog console_;
  parallel::Mesh& mesh_;
  PrecisionPolicy precision_;
  torch::ScalarType dtype_, compute_dtype_, residual_dtype_;
  TrainerParts parts_;  // what build() returns, filled as it goes
  // The student's and the teacher's shapes as built: model.* and the teacher's, padded alike.
  layers::ModelConfig student_model_, teacher_model_;
  TeacherSource teacher_source_;
  TokenizerIdentity student_tokenizer_;
  std::string peak_how_;
};

TrainerParts TrainerBuilder::build() {
  // This run's kernel mode and compute copies, shared by its model, teacher and distiller and
  // by nothing else in the process (layers/run_context.h).
  parts_.run->mode = kernels::kernel_mode_for(config_.runtime.kernels == KernelChoice::aten
                                                  ? kernels::KernelMode::aten
                                                  : kernels::KernelMode::automatic);
  parts_.run->copies.set_kept(config_.memory.keep_compute_weights);
  MemoryTracker& memory = MemoryTracker::install();  // before the first parameter
  parallel::set_collective_timeout(config_.runtime.collective_timeout_s);
  parts_.device = parallel::rank_device(config_.runtime.device == Device::cuda, mesh_.local_rank(),
                                        int(config_.runtime.gpus_per_node), "runtime.device=cuda");
  const int gpu = parts_.device.is_cuda() ? parts_.device.index() : -1;
  if (parts_.device.is_cuda()) attach_cuda_memory_trace();  // GPU memory in the same account
  report_transports(mesh_.choose_transports(transport_choice(config_.parallel.gpu_transport), gpu));
  if (config_.parallel.p2p_rules == P2pRules::nccl)
    mesh_.pp().set_point_to_point_rules(parallel::PointToPointRules::nccl);
  const parallel::Layout& layout = config_.layout;
  // A run the machine plainly cannot hold stops here, not in the kernel's out-of-memory killer
  // or in an allocation deep inside the first step.
  run_agreed_over(&mesh_.world(), [&] {
    const int ranks_here = mesh_.ranks_on_host();
    if (parts_.device.is_cpu())
      require_memory(estimate_memory(config_).total(), ranks_here,
                     "this run (the memory estimate engine_train --dry-run prints)");
  });
  parts_.tp.group = &mesh_.tp();
  parts_.tp.sequence_parallel = layout.sequence_parallel && layout.tensor > 1;
  resolve_teacher();  // before the student: a teacher's vocabulary may pad the student's
  const int stage_index = mesh_.coordinates().pp;
  layers::ModelStage stage;
  if (!config_.stages.empty()) {
    const parallel::LayerRange& layers = config_.stages.at(stage_index);
    stage = {layers.first, layers.end, stage_index == 0, stage_index == layout.pipeline - 1};
  }
  {
    MemoryScope parameters(MemoryCategory::parameters);
    parts_.store = std::make_unique<layers::ParameterStore>(config_.seed, dtype_,
                                                            parts_.tp.position(), parts_.device);
    parts_.store->set_lr_scale_rule(
        [policy = config_.params](const std::string& name) { return policy.lr_scale(name); });
    parts_.model =
        std::make_unique<layers::LlamaModel>(student_model_, *parts_.store, parts_.tp, stage);
  }
  parts_.model->set_kernels(
      {config_.memory.fused_kernels, config_.memory.attention_block_rows, true, parts_.run.get()});
  initialise_student();
  settle_student_tokenizer();
  check_parameter_patterns(config_.params, *parts_.store, mesh_.pp(), log_);
  build_distiller();
  const layers::MemoryConfig& memory_config = config_.memory;
  if (memory_config.activation_offloading)
    parts_.offloader = std::make_unique<layers::ActivationOffloader>();
  parts_.model->set_recompute({memory_config.activation_checkpointing, parts_.offloader.get()});
  parts_.model->set_head_chunk_tokens(memory_config.head_chunk_tokens);
  parts_.model->set_defer_head_gradient(memory_config.defer_head_gradient);
  parts_.model->set_types(compute_dtype_, residual_dtype_);
  // Gradients are allocated inside backward as temporaries; once accumulated they count as
  // gradients (hooked before the gradient sync, which may free them).
  parts_.gradient_accounting = std::make_unique<GradReadyHooks>(
      *parts_.store, [store = parts_.store.get(), &memory](size_t k) {
        memory.retag(store->all()[k].value.grad(), MemoryCategory::gradients);
      });
  GradSyncOptions sync;
  sync.bucket_bytes = static_cast<int64_t>(config_.parallel.dp_bucket_mb * 1e6);
  // The shared-memory sum reads host memory: GPU gradients go through the group's transport.
  sync.shared_memory = config_.parallel.dp_shared_memory && parts_.device.is_cpu();
  if (precision_.dp_gradient_sum != precision_.main)
    sync.reduce_dtype = scalar_type_of(precision_.dp_gradient_sum);
  sync.zero = config_.optimizer.zero_stage == 1;
  sync.tied_embeddings = config_.model.tied_embeddings;
  sync.complete_in_backward = config_.optimizer.in_backward;
  const int64_t head_index = head_weight_index();
  HeadGradientFacts head_facts;
  head_facts.embedding_here = parts_.model->stage().embedding;
  head_facts.head_here = head_index >= 0;
  head_facts.dp_size = mesh_.gradient_reduction().size();
  head_facts.head_frozen = head_index >= 0 && parts_.store->all()[size_t(head_index)].spec.frozen();
  parts_.head_gradient = resolve_head_gradient(config_, head_facts);
  const int64_t streamed_head = streams_to_stepper(parts_.head_gradient) ? head_index : -1;
  if (streamed_head >= 0) sync.streamed.push_back(size_t(streamed_head));
  sync.gradient_offers = &parts_.run->gradients;
  parts_.sync = std::make_unique<GradientSync>(*parts_.store, mesh_, parts_.tp, sync);
  {
    MemoryScope state(MemoryCategory::optimizer_state);
    parts_.optimizer =
        std::make_unique<AdamW>(*parts_.store, config_.optimizer,
                                [sync = parts_.sync.get()](size_t i) { return sync->owns(i); });
  }
  parts_.stage_step = std::make_unique<StageStep>(
      StageModels{parts_.model.get(), parts_.teacher.get(), parts_.distiller.get(),
                  parts_.cached_teacher.get(), parts_.valid_cached_teacher.get()},
      parts_.tp, config_.data.seq_len, scalar_type_of(precision_.pipeline_message));
  if (streamed_head >= 0) {
    HeadRowStepOptions options;
    options.index = size_t(streamed_head);
    options.tied_here = config_.model.tied_embeddings;  // and so on this stage
    options.vocab_start = parts_.tp.rank() * parts_.store->all()[options.index].value.size(0);
    options.owner = parts_.sync->zero() ? parts_.sync->zero()->owner(options.index) : -1;
    options.shared_memory = config_.parallel.dp_shared_memory && parts_.device.is_cpu();
    options.reduce_in_blocks = config_.parallel.dp_head_blocks;
    // Stepping inside backward, or (reduce-only) only reducing it in blocks over DP.
    AdamW* stepping = parts_.head_gradient == HeadGradient::stepped_in_backward
                          ? parts_.optimizer.get()
                          : nullptr;
    parts_.head_stepper = std::make_unique<HeadRowStepper>(*parts_.store, stepping,
                                                           mesh_.gradient_reduction(), options);
    HeadRowStepper* stepper = parts_.head_stepper.get();
    parts_.sync->set_on_streamed_ready([stepper](size_t) { stepper->complete(); });
    if (!stepping) parts_.sync->set_on_progress([stepper] { stepper->progress(); });
    parts_.stage_step->set_head_grad_sink(parts_.head_stepper.get());
  }
  RunFacts facts;
  facts.on_gpu = parts_.device.is_cuda();
  facts.dp_size = mesh_.gradient_reduction().size();
  facts.dp_sum_in_shared_memory = parts_.sync->reduces_in_shared_memory();
  facts.head_gradient_deferred = parts_.head_gradient == HeadGradient::tied_deferred;
  if (log_)
    for (const std::string& line : keys_without_effect(config_, facts))
      *log_ << "retort: " << line << "\n";
  // The shared-memory DP segments hold the summed gradients (their .grad() views them).
  parts_.shared_gradient_bytes =
      parts_.sync->shared_bytes() + (parts_.head_stepper ? parts_.head_stepper->shared_bytes() : 0);
  memory.add_outside(MemoryCategory::gradients, parts_.shared_gradient_bytes);
  if (log_ && mesh_.gradient_reduction().size() > 1)
    *log_ << "retort: dp gradient sum: " << parts_.sync->describe_dp_sum() << "\n";
  VocabularyLimit vocabulary{config_.model.vocab_size, "model.vocab_size"};
  if (parts_.teacher && parts_.teacher->config().vocab_size < vocabulary.size)
    vocabulary = {parts_.teacher->config().vocab_size, "the teacher's vocab_size"};
  parts_.streams = build_sample_streams(config_.data, config_.seed, vocabulary);

  parts_.progress.seed = config_.seed;
  parts_.progress.model_json = model_config_json(config_.model);
  parts_.progress.seq_len = config_.data.seq_len;
  parts_.progress.dtype = enum_name(config_.dtype);
  parts_.progress.tokenizer = student_tokenizer_.fingerprint;
  parts_.progress.data_seed = data_order_seed(config_.data, config_.seed);

  if (config_.checkpoint.load == "auto") {
    // The newest checkpoint of run.dir that loads (its index.json is there and its checksums
    // hold); a damaged one is reported and the one before it tried, never skipped in silence.
    // None at all: a fresh start.
    std::string path, newest_reason;
    const std::vector<std::string> candidates = checkpoint_folders(config_.run_dir);
    for (const std::string& candidate : candidates) {
      try {
        parts_.progress = load_checkpoint(candidate, mesh_, *parts_.store, parts_.optimizer.get());
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
    parts_.progress = load_checkpoint(path, mesh_, *parts_.store, parts_.optimizer.get());
    finish_resume(path);
  }
  parts_.flops_per_token = config_.model.training_flops_per_token(config_.data.seq_len);
  if (config_.runtime.peak_gflops > 0) {
    parts_.peak_gflops = config_.runtime.peak_gflops;
    peak_how_ = "runtime.peak_gflops";
  } else if (parts_.device.is_cuda()) {
    const DevicePeak peak =
        device_compute_peak(parts_.device.index(), precision_.compute == NumberType::bfloat16);
    parts_.peak_gflops = peak.gflops;
    peak_how_ = peak.how;
  } else {
    const ComputePeak peak = measure_compute_peak(torch::get_num_threads(), mesh_.ranks_on_host());
    parts_.peak_gflops = peak.gflops;
    peak_how_ = peak.how;
  }
  char line[256];
  std::snprintf(line, sizeof line, "MFU against %.1f GFLOP/s per rank (%s)", parts_.peak_gflops,
                peak_how_.c_str());
  log_line(line);
  return std::move(parts_);
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
  parts_.progress.model_json = model_config_json(config_.model);
  parts_.progress.seq_len = config_.data.seq_len;
  const std::string dtype = enum_name(config_.dtype);
  if (!parts_.progress.dtype.empty() && parts_.progress.dtype != dtype)
    log_line("warning: checkpoint '" + path + "' was trained in " + parts_.progress.dtype +
             "; this run goes on in " + dtype + " (model.dtype)");
  parts_.progress.dtype = dtype;
  const TokenizerIdentity recorded{parts_.progress.tokenizer, "checkpoint '" + path + "'"};
  require_same_tokenizer(student_tokenizer_, recorded, "data.tokenizer",
                         "resume the run with the tokenizer its data was made with");
  parts_.progress.tokenizer = known_of(student_tokenizer_, recorded).fingerprint;
  if (parts_.progress.seed != static_cast<uint64_t>(config_.seed))
    throw UserError("checkpoint '" + path + "' was trained with seed " +
                    std::to_string(parts_.progress.seed) + " but the config has seed " +
                    std::to_string(config_.seed) + "; the data order would differ");
  const uint64_t data_seed = data_order_seed(config_.data, config_.seed);
  if (parts_.progress.data_seed != 0 && parts_.progress.data_seed != data_seed)
    throw UserError("checkpoint '" + path + "' read its data in the order of data seed " +
                    std::to_string(parts_.progress.data_seed) + " but this run's is " +
                    std::to_string(data_seed) +
                    " (data.seed, else seed); the data order would differ");
  parts_.progress.data_seed = data_seed;
  log_line("resumed from " + path + " at step " + std::to_string(parts_.progress.step));
}

void TrainerBuilder::initialise_student() {
  const ParamPolicy& policy = config_.params;
  if (policy.init_from.empty()) return;
  const bool hf = hf::is_hf_model_dir(policy.init_from);
  const std::string path = hf ? policy.init_from : resolve_checkpoint(policy.init_from);
  if (hf)  // a Hugging Face directory; its shapes must be the student's
    hf::load_hf_parameters(path, hf::read_hf_config(path), *parts_.store, parts_.tp);
  else
    load_checkpoint(path, mesh_, *parts_.store, nullptr);  // parameters only, strictly
  torch::NoGradGuard no_grad;
  // Parameters reset per pattern; summed over pipeline stages, which hold different ones.
  torch::Tensor matched = torch::zeros({int64_t(policy.init_reset.size()) + 1}, torch::kLong);
  int64_t reset = 0;
  for (auto& p : parts_.store->all()) {
    bool matches = false;
    for (size_t i = 0; i < policy.init_reset.size(); ++i)
      if (fnmatch(policy.init_reset[i].c_str(), p.spec.name.c_str(), 0) == 0) {
        matches = true;
        matched[i] += 1;
      }
    if (!matches) continue;
    p.value.copy_(from_global(layers::initial_global_value(p.spec, config_.seed), p.spec, parts_.tp,
                              p.value));
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

void TrainerBuilder::settle_student_tokenizer() {
  student_tokenizer_ = tokenizer_of_data(config_.data.tokenizer);
  const std::string& init = config_.params.init_from;
  if (init.empty()) return;
  const bool hf = hf::is_hf_model_dir(init);
  const TokenizerIdentity initial = tokenizer_of_model(hf ? init : resolve_checkpoint(init), hf);
  require_same_tokenizer(student_tokenizer_, initial, "model.init.from",
                         "the model would read the data's ids as other tokens");
  student_tokenizer_ = known_of(student_tokenizer_, initial);
}

void TrainerBuilder::resolve_teacher() {
  const DistillSettings& settings = config_.distill;
  student_model_ = config_.model;
  if (!settings.enabled) return;
  teacher_source_ = resolve_teacher_source(settings);
  teacher_model_ = teacher_source_.model;
  if (!teacher_source_.path.empty()) {
    const parallel::Layout& layout = config_.layout;
    parallel::resolve_layout(
        layout, layout.tensor * layout.pipeline * layout.data,
        {teacher_model_.heads, teacher_model_.kv_heads, teacher_model_.ffn_hidden,
         std::max<int64_t>(teacher_model_.layers, layout.pipeline), config_.data.seq_len});
  }
  // One tokenizer, two vocabulary sizes (one padded further): both padded alike. A cached
  // teacher's vocabulary is the cache's (open_teacher_cache).
  if (config_.distill.keys.cache.empty() && teacher_model_.vocab_size != student_model_.vocab_size)
    layers::pad_vocabularies_alike(student_model_, teacher_model_);
}

void TrainerBuilder::open_teacher_cache() {
  const DistillSettings& settings = config_.distill;
  CacheExpectations expected;
  // The fingerprint on world rank 0 alone (it reads every data file, and a Hugging Face
  // teacher's every weight file, through a CRC); a mismatch found there stops every rank.
  if (mesh_.world().rank() == 0)
    expected.fingerprint =
        cache_fingerprint(config_, teacher_source_.path.empty() ? "" : teacher_source_.identity(),
                          student_tokenizer_.fingerprint);
  expected.seq_len = config_.data.seq_len;
  expected.top_k = settings.objective.logits.teacher_top_k;
  expected.vocab_size = student_model_.vocab_size;
  expected.samples_drawn = config_.training.steps * config_.training.global_batch;
  expected.fingerprint["split"] = "training";
  // The validation samples' entries, where the cache has them and this run evaluates: the
  // held-out logit loss (valid_logit_loss) beside the LM loss.
  const std::string valid_dir = validation_cache_dir(settings.keys.cache);
  const bool with_valid =
      config_.training.eval_every > 0 && std::filesystem::exists(valid_dir + "/cache.json");
  CacheExpectations valid = expected;
  valid.fingerprint["split"] = "validation";
  valid.samples_drawn = config_.training.eval_batches * config_.training.global_batch;
  run_agreed_over(&mesh_.world(), [&] {
    parts_.cached_teacher = std::make_unique<CachedTeacher>(settings.keys.cache, expected);
    if (with_valid) parts_.valid_cached_teacher = std::make_unique<CachedTeacher>(valid_dir, valid);
  });
  log_line("the teacher's logits come from teacher.cache " + settings.keys.cache + " (top " +
           std::to_string(parts_.cached_teacher->top_k()) + ", " +
           enum_name(settings.objective.logits.top_k_tail) + ")" +
           (settings.objective.activation_weight > 0
                ? "; the teacher runs up to its last captured layer for the activation losses"
                : "; no teacher weights are loaded"));
}

void TrainerBuilder::build_distiller() {
  const DistillSettings& settings = config_.distill;
  if (!settings.enabled) return;
  const bool cached = !settings.keys.cache.empty();
  if (cached && settings.objective.logit_weight > 0) open_teacher_cache();
  const layers::ModelConfig& teacher_model = teacher_model_;
  if (!teacher_source_.path.empty())
    require_same_tokenizer(
        student_tokenizer_, tokenizer_of_model(teacher_source_.path, teacher_source_.hf),
        "teacher.checkpoint", "a teacher must read the student's ids as the same tokens");
  if (!cached && teacher_model.vocab_size != student_model_.vocab_size)
    log_line("the teacher's vocabulary (" + std::to_string(teacher_model.vocab_size) +
             ") and the student's (" + std::to_string(student_model_.vocab_size) +
             ") differ: the logit loss runs over the " +
             std::to_string(std::min(teacher_model.vocab_size, student_model_.vocab_size)) +
             " ids both have" +
             (student_tokenizer_.known()
                  ? ""
                  : " (give data.tokenizer to have the tokenizers compared)"));
  if (!cached && settings.objective.logits.teacher_top_k > teacher_model.vocab_size)
    throw UserError(
        "distill.teacher_top_k=" + std::to_string(settings.objective.logits.teacher_top_k) +
        " is above the teacher's vocabulary (" + std::to_string(teacher_model.vocab_size) + ")");
  distill::DistillConfig objective = settings.objective;
  objective.pairs =
      distill::make_activation_pairs(objective.pair_names, objective.every_layer_points,
                                     config_.model.layers, teacher_model.layers);
  if (parts_.cached_teacher) objective.logits.teacher_top_k = parts_.cached_teacher->top_k();
  const std::vector<distill::ActivationPair>& pairs = objective.pairs;
  const bool activations = objective.activation_weight > 0;
  // With the logits cached, the teacher runs only as far as its last captured layer.
  int64_t teacher_layers_run = teacher_model.layers;
  if (cached) {
    teacher_layers_run = 0;
    if (activations)
      for (const distill::ActivationPair& pair : pairs)
        teacher_layers_run = std::max(teacher_layers_run, layers::capture_layer(pair.teacher) + 1);
  }
  // Under pipeline parallelism the teacher's layers are split so that each pair's teacher
  // layer runs on the stage of its student layer (its hidden state travels with the student's).
  layers::ModelStage teacher_stage;
  if (cached) teacher_stage = {0, teacher_layers_run, true, false};
  if (config_.layout.pipeline > 1 && (!cached || activations)) {
    std::vector<std::pair<int, int64_t>> pins;
    if (activations)
      for (const distill::ActivationPair& pair : pairs)
        pins.emplace_back(
            parallel::stage_of_layer(config_.stages, layers::capture_layer(pair.student)),
            layers::capture_layer(pair.teacher));
    const parallel::LayerRange layers_here = parallel::split_layers_pinned(
        teacher_layers_run, config_.layout.pipeline, pins)[mesh_.coordinates().pp];
    teacher_stage = {layers_here.first, layers_here.end, parts_.model->stage().embedding,
                     parts_.model->stage().head && !cached};
  }
  if (!cached || activations) {
    {
      MemoryScope weights(MemoryCategory::teacher_weights);
      parts_.teacher =
          std::make_unique<distill::Teacher>(teacher_model, settings.keys.seed, compute_dtype_,
                                             parts_.tp, teacher_stage, parts_.device);
    }
    parts_.teacher->set_residual_type(residual_dtype_);
    parts_.teacher->set_run(parts_.run.get());
    load_teacher_weights(teacher_source_, teacher_model, mesh_, parts_.tp, *parts_.teacher,
                         /*whole=*/!cached);
  }
  MemoryScope projections(MemoryCategory::parameters);
  parts_.distiller =
      std::make_unique<distill::Distiller>(objective, parts_.teacher.get(), student_model_,
                                           *parts_.store, parts_.tp, parts_.model->stage());
  if (parts_.cached_teacher)
    parts_.distiller->take_logits_from_cache(parts_.cached_teacher->vocab_size());
  parts_.distiller->set_kernels(parts_.model->kernels());
}

int64_t TrainerBuilder::head_weight_index() const {
  if (!parts_.model->stage().head) return -1;
  const std::vector<layers::Parameter>& all = parts_.store->all();
  for (size_t k = 0; k < all.size(); ++k)
    if (all[k].value.is_same(parts_.model->head_weight())) return int64_t(k);
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
