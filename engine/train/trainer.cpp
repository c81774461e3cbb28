// engine/train/trainer.cpp: see trainer.h.
#include "engine/train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <ostream>

#include "common/make_directories.h"
#include "common/resident_memory.h"
#include "common/trace_span.h"
#include "common/user_error.h"
#include "engine/checkpoint/stage_agreement.h"
#include "engine/data/batches.h"
#include "engine/observe/chrome_trace.h"
#include "engine/observe/memory_tracker.h"
#include "engine/observe/metrics.h"
#include "engine/observe/run_summary.h"
#include "engine/train/head_gradient.h"
#include "engine/train/run_folder.h"
#include "engine/train/stop_signal.h"
#include "parallel/communicator.h"

namespace retort::engine {
namespace fs = std::filesystem;
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

torch::Tensor to_tensor(const std::vector<int64_t>& values, int64_t batch) {
  return torch::tensor(values, torch::kLong).view({batch, -1});
}

}  // namespace

torch::Tensor Trainer::placed(const torch::Tensor& host) const {
  if (parts_.device.is_cpu()) return host;
  // Through pinned memory, without waiting: the copy is queued before the step's kernels.
  return host.pin_memory().to(parts_.device, /*non_blocking=*/true);
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
      mesh_(mesh ? *mesh : *own_mesh_) {
  const parallel::Layout& layout = config_.layout;
  if (own_mesh_ && layout.tensor * layout.pipeline * layout.data != 1)
    throw UserError("layout " + parallel::describe(layout) + " needs MPI ranks");
  parts_ = build_trainer_parts(config_, log_, mesh_);
  // Optimizer-in-backward: each parameter steps as the sync reports its gradient final.
  if (config_.optimizer.in_backward)
    parts_.sync->set_on_final([this](size_t k) { step_in_backward(k); });
}

Trainer::~Trainer() {
  MemoryTracker::install().add_outside(MemoryCategory::gradients, -parts_.shared_gradient_bytes);
  // The 16-bit copies of this trainer's weights go with its run context.
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
    if (parts_.distiller) {
      const std::vector<double> parts = result.terms.values();
      values.insert(values.end(), parts.begin(), parts.end());
    }
    torch::Tensor t = torch::tensor(values, torch::kDouble);
    group->all_reduce(t);
    values.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    result.loss = values[0];
    if (parts_.distiller) result.terms.assign_values({values.begin() + 1, values.end()});
  }
  if (!parts_.distiller) result.terms.lm = result.loss;
}

std::vector<MicroBatch> Trainer::read_micro_batches(double& target_count) {
  const TrainingConfig& training = config_.training;
  const parallel::DataSplit split = mesh_.data_split();
  BatchPlan plan(training.global_batch, training.micro_batch, split.count, split.index);
  std::vector<MicroBatch> micro;
  int64_t local_targets = 0;
  for (int64_t m = 0; m < plan.micro_batches_per_step(); ++m) {
    const int64_t first = plan.first_sample(parts_.progress.step, m);
    const TokenBatch batch = read_batch(*parts_.streams.train, first, training.micro_batch);
    const torch::Tensor tokens = to_tensor(batch.inputs, batch.batch);
    micro.push_back({placed(tokens), placed(to_tensor(batch.targets, batch.batch)),
                     first - parts_.progress.step * training.global_batch, first, tokens});
    local_targets += int64_t(batch.targets.size());  // no padding: every target counts
  }
  // Losses are normalised by the target count of the whole global batch.
  target_count = dp_sum(double(local_targets));
  return micro;
}

void Trainer::step_in_backward(size_t k) {
  layers::Parameter& p = parts_.store->all()[k];
  grad_squares_[k] = grad_square(p);
  parts_.optimizer->step_parameter(k, step_lr_);
  p.value.mutable_grad().reset();
}

void Trainer::clear_gradients() {
  for (auto& p : parts_.store->all())
    if (p.value.grad().defined()) p.value.mutable_grad().reset();
}

StepResult Trainer::train_step() {
  using clock = std::chrono::steady_clock;
  StepResult result;
  result.step = parts_.progress.step + 1;
  TraceSpan step_span([&] { return "retort step " + std::to_string(result.step); });
  double target_count = 0;
  const std::vector<MicroBatch> micro = read_micro_batches(target_count);
  clear_gradients();
  parts_.sync->offer_gradient_memory();  // the DP sum's shared region, where it has one
  // The schedule follows optimizer steps taken: a skipped step does not advance it.
  result.lr = config_.optimizer.schedule.at(parts_.optimizer->steps());
  const bool in_backward = config_.optimizer.in_backward;
  if (in_backward) {  // parameters step as GradientSync reports them final
    parts_.optimizer->begin_step();
    step_lr_ = result.lr;
    grad_squares_.assign(parts_.store->all().size(), torch::Tensor());
  }
  if (parts_.head_stepper) {
    std::vector<torch::Tensor> tokens;
    for (const MicroBatch& b : micro) tokens.push_back(b.host_tokens);  // host-side bookkeeping
    parts_.head_stepper->begin_step(tokens, result.lr);
  }
  if (parts_.distiller && parts_.distiller->uses_activations())  // every stage reports every pair
    for (const distill::ActivationPair& pair : parts_.distiller->pairs())
      result.terms.per_pair[pair.student] = 0;
  distill::PendingTerms pending;  // the step's scalars, read to the host once below
  parts_.stage_step->train(mesh_.pp(), micro, target_count, result.step, *parts_.sync, inspector_,
                           pending, result.times);

  auto start = clock::now();
  TraceSpan sync_span([] { return "retort gradient sync"; });
  parts_.sync->finish();
  // The gradient norm's square, reduced on the gradients' device.
  auto grad_square = [&] {
    if (in_backward && parts_.head_stepper)
      grad_squares_[parts_.head_stepper->index()] = parts_.head_stepper->grad_square();
    return in_backward ? grad_square_sum(*parts_.store, grad_squares_, parts_.tp,
                                         parts_.sync->sharded_over(), &mesh_.pp())
                       : global_grad_square_sum(*parts_.store, parts_.tp,
                                                parts_.sync->sharded_over(), &mesh_.pp());
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
    parts_.progress.step += 1;  // the data moves past the bad batch; the schedule does not
    parts_.progress.consumed_samples += config_.training.global_batch;
    if (inspector_ && inspector_->on_step_end) inspector_->on_step_end(result);
    return result;
  }
  if (!in_backward) {
    scale_to_norm(*parts_.store, result.grad_norm, config_.optimizer.grad_clip);
    parts_.optimizer->step(result.lr);
  }
  if (ZeroPartition* zero = parts_.sync->zero()) zero->all_gather_parameters(*parts_.store);
  result.times.optimizer_s = seconds_since(start);
  parts_.progress.step += 1;
  parts_.progress.consumed_samples += config_.training.global_batch;
  if (inspector_ && inspector_->on_step_end) inspector_->on_step_end(result);
  return result;
}

Trainer::Validation Trainer::validate() {
  if (!parts_.streams.valid) return {std::nan(""), std::nullopt};
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
        read_batch(*parts_.streams.valid, first, std::min(training.micro_batch, samples - first));
    const torch::Tensor targets = to_tensor(b.targets, b.batch);
    count += double(layers::count_targets(targets));
    mine.push_back({placed(to_tensor(b.inputs, b.batch)), placed(targets), first, first});
  }
  // On the last stage; 0 on the others. With the validation samples' cached teacher, the
  // logit loss against it too.
  const bool logits = parts_.valid_cached_teacher != nullptr;
  double logit_sum = 0;
  torch::Tensor sums = torch::tensor(
      {parts_.stage_step->evaluate(mesh_.pp(), mine, logits ? &logit_sum : nullptr), logit_sum},
      torch::kDouble);
  mesh_.pp().all_reduce(sums);
  const double targets = dp_sum(count);
  Validation result{dp_sum(sums[0].item<double>()) / targets, std::nullopt};
  if (logits) result.logit_loss = dp_sum(sums[1].item<double>()) / targets;
  return result;
}

double Trainer::evaluate() {
  return validate().lm_loss;
}

void Trainer::save(const std::string& path) {
  save_checkpoint(path, mesh_, *parts_.store, parts_.optimizer.get(), parts_.sync->zero(),
                  parts_.progress);
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
  metrics.mfu = metrics.tokens_per_s * parts_.flops_per_token /
                (parts_.peak_gflops * 1e9 * mesh_.world().size());
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
  if (eval_now && parts_.streams.valid) {
    const Validation validation = validate();
    metrics.valid_loss = validation.lm_loss;
    metrics.valid_logit_loss = validation.logit_loss;
  }
  if (parts_.distiller) {
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
  metrics.mfu = metrics.tokens_per_s * parts_.flops_per_token /
                (parts_.peak_gflops * 1e9 * mesh_.world().size());
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
  if (parts_.progress.step >= training.steps) {
    log_line("nothing to do: already at step " + std::to_string(parts_.progress.step) + " of " +
             std::to_string(training.steps));
    return results;
  }
  using clock = std::chrono::steady_clock;
  auto interval_start = clock::now();
  double interval_comm_start = parallel::exposed_communication_seconds();
  int64_t interval_steps = 0;
  const std::vector<int64_t>& profile = config_.logging.profile_steps;
  if (!profile.empty() && parts_.progress.step + 1 > profile[0])
    log_line("warning: logging.profile_steps = [" + std::to_string(profile[0]) + ", " +
             std::to_string(profile[1]) + "] starts before step " +
             std::to_string(parts_.progress.step + 1) +
             ", where this run resumes; no trace will be written");
  ChromeTrace trace;
  while (parts_.progress.step < training.steps) {
    if (!profile.empty() && parts_.progress.step + 1 == profile[0]) trace.start();
    const auto step_start = clock::now();
    results.push_back(train_step());
    show_progress(results.back(), seconds_since(step_start));
    if (trace.running() &&
        (parts_.progress.step >= profile[1] || parts_.progress.step >= training.steps)) {
      const std::string path =
          trace.stop_and_write((fs::path(config_.run_dir) / "trace").string(), mesh_.world());
      if (!path.empty())
        log_line("wrote the Chrome trace of steps " + std::to_string(profile[0]) + "-" +
                 std::to_string(parts_.progress.step) + " to " + path);
    }
    ++interval_steps;
    const int64_t step = parts_.progress.step;
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
