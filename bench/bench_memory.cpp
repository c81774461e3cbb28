// bench/bench_memory.cpp: what each memory feature costs and saves, in one invocation: peak
// bytes by category (parameters, gradients, optimizer state, student activations, teacher
// weights, teacher activations, the rest; the offloaded host store apart) and tokens/s of
// full training steps, for
//   (1) a 39.6M-parameter Llama (hidden 512, 8 layers, 8 heads, 4 kv heads, ffn 1376, vocab
//       32000 tied), and
//   (2) the distillation setup of bench_distill: that model as teacher, its width with half
//       its depth as student (28.1M), forward KL on the logits and mse on each student
//       layer's mixer output, next to the same student trained on the LM loss alone;
// under baseline, full checkpointing, selective checkpointing, offloading (with full
// checkpointing: what it moves is what checkpointing keeps), the optimizer step inside
// backward, and all of them (full + offloading + in backward). Micro-batch 4 x 256 tokens,
// one micro-batch per step, optimizer.grad_clip 0 everywhere (in_backward cannot clip).
// (3) model (1) again in bf16 mixed precision (model.dtype=bfloat16) under every variant, and
// the distillation's baseline in bf16, with the bytes per parameter by category of the fp32
// and bf16 baselines.
// Model (1), fp32 and bf16, also with the tied head's gradient deferred to the end of backward
// (memory.defer_head_gradient), and in bf16 with the weights' copies cast at each use
// (memory.keep_compute_weights=false), alone, with the deferred head, and with everything.
// Then the issues' targets, each with the measured figure, and what the two keys cost in
// throughput (trainers alive together, their single steps alternated).
// The tokens/s of the table are one run of `steps` steps each.
// Usage: bench_memory [steps=2] [threads=cores] [key=value ...] (keys added to every run)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "bench_args.h"
#include "bench_setup.h"
#include "common/compute_threads.h"
#include "engine/observe/memory_tracker.h"
#include "engine/train/trainer.h"

using namespace retort;

namespace {

struct Measured {
  double tokens_per_s = 0;
  engine::MemorySplit peak;
  int64_t activations_peak = 0;  // the activations' own peak, wherever the device peak fell
  int64_t host_peak = 0;
  int64_t trainable_bytes = 0;
  int64_t parameter_count = 0;  // the student's
};

struct Variant {
  const char* name;
  std::vector<std::string> keys;
};

const std::vector<Variant> kVariants = {
    {"baseline", {}},
    {"full checkpointing", {"memory.activation_checkpointing=full"}},
    {"selective", {"memory.activation_checkpointing=selective"}},
    {"offloading (+full)",
     {"memory.activation_checkpointing=full", "memory.activation_offloading=true"}},
    {"optimizer in backward", {"optimizer.in_backward=true"}},
    {"all together",
     {"memory.activation_checkpointing=full", "memory.activation_offloading=true",
      "optimizer.in_backward=true"}},
};

// The head's gradient formed at the end of backward: LM runs only (the distillation's fused
// logit losses form it as before).
const Variant kHeadDeferred{"head deferred", {"memory.defer_head_gradient=true"}};

// bf16 only: the weights' bf16 copies cast at each use instead of kept between steps.
const std::vector<Variant> kBf16Only = {
    {"copies per use", {"memory.keep_compute_weights=false"}},
    {"per use + deferred",
     {"memory.keep_compute_weights=false", "memory.defer_head_gradient=true"}},
    {"all + per use",
     {"memory.activation_checkpointing=full", "memory.activation_offloading=true",
      "optimizer.in_backward=true", "memory.keep_compute_weights=false"}},
};

std::vector<std::string> shape(const std::string& prefix, int64_t layers) {
  return {prefix + ".hidden=512", prefix + ".layers=" + std::to_string(layers), prefix + ".heads=8",
          prefix + ".kv_heads=4", prefix + ".ffn_hidden=1376"};
}

Measured measure_run(const std::vector<std::string>& assignments, int steps) {
  engine::MemoryTracker& memory = engine::MemoryTracker::install();
  const engine::TrainConfig config = bench::bench_config(assignments);
  engine::Trainer trainer(config, nullptr);
  Measured m;
  for (const auto& p : trainer.parameters().all()) {
    if (!p.spec.frozen()) m.trainable_bytes += p.value.numel() * p.value.element_size();
    m.parameter_count += p.value.numel();
  }
  trainer.train_step();  // warm-up: lazily built state and tables
  memory.reset_peak();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) trainer.train_step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.tokens_per_s = double(steps * config.training.global_batch * config.data.seq_len) / s;
  m.peak = memory.peak_split();
  m.activations_peak = memory.category_peaks().of(MemoryCategory::activations);
  m.host_peak = memory.peak_offloaded_bytes();
  return m;
}

// Trainers alive together, their single steps alternated for `rounds` rounds (the order
// rotating each round) after two warm-up steps each: for each trainer after the first, each
// round's step-time ratio first / it (its tokens/s against the first's).
std::vector<std::vector<double>> alternated_ratios(
    const std::vector<std::vector<std::string>>& runs, int rounds) {
  std::vector<std::unique_ptr<engine::Trainer>> trainers;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<std::string> keys = runs[i];
    keys.push_back("training.steps=" + std::to_string(rounds + 3));
    keys.push_back("run.dir=" + (std::filesystem::temp_directory_path() /
                                 ("retort_bench_memory_alternated" + std::to_string(i)))
                                    .string());
    trainers.push_back(std::make_unique<engine::Trainer>(bench::bench_config(keys), nullptr));
  }
  for (int warm = 0; warm < 2; ++warm)
    for (auto& trainer : trainers) trainer->train_step();
  std::vector<std::vector<double>> ratios(runs.size());
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> seconds(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      const size_t k = (round + i) % runs.size();
      const auto start = std::chrono::steady_clock::now();
      trainers[k]->train_step();
      seconds[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    for (size_t k = 1; k < runs.size(); ++k) ratios[k].push_back(seconds[0] / seconds[k]);
  }
  return ratios;
}

double mb(int64_t bytes) {
  return double(bytes) / 1e6;
}

void print_row(const char* setup, const char* variant, const Measured& m, const Measured& base) {
  using C = MemoryCategory;
  const engine::MemorySplit& p = m.peak;
  std::printf(
      "| %-8s | %-21s | %8.0f | %5.2f | %7.1f | %6.1f | %6.1f | %6.1f | %6.1f | %7.1f | %7.1f | "
      "%7.1f | %6.1f | %6.1f |\n",
      setup, variant, m.tokens_per_s, m.tokens_per_s / base.tokens_per_s, mb(p.device()),
      mb(p.of(C::parameters)), mb(p.of(C::compute_weights)), mb(p.of(C::gradients)),
      mb(p.of(C::optimizer_state)), mb(p.of(C::activations)), mb(p.of(C::teacher_weights)),
      mb(p.of(C::teacher_activations)), mb(p.of(C::other)), mb(m.host_peak));
}

const char* verdict(bool ok) {
  return ok ? "met" : "NOT met";
}

}  // namespace

int measure(int argc, char** argv) {
  const int steps = int(bench::count_argument(argc, argv, 1, "steps", 2));
  const int threads =
      int(bench::count_argument(argc, argv, 2, "threads", std::thread::hardware_concurrency()));
  set_compute_threads(threads);
  const std::string dir = (std::filesystem::temp_directory_path() / "retort_bench_memory").string();
  std::vector<std::string> common = bench::measured_run_keys(dir, steps);
  common.push_back("optimizer.grad_clip=0");
  for (int i = 3; i < argc; ++i) common.push_back(argv[i]);  // e.g. memory.fused_kernels=false

  // (1) The 39.6M model, LM loss.
  std::vector<std::string> lm = common;
  for (const std::string& key : shape("model", 8)) lm.push_back(key);
  std::map<std::string, Measured> lm_runs;
  for (const Variant& v : kVariants) {
    std::vector<std::string> keys = lm;
    keys.insert(keys.end(), v.keys.begin(), v.keys.end());
    lm_runs[v.name] = measure_run(keys, steps);
  }
  {
    std::vector<std::string> keys = lm;
    keys.insert(keys.end(), kHeadDeferred.keys.begin(), kHeadDeferred.keys.end());
    lm_runs[kHeadDeferred.name] = measure_run(keys, steps);
  }

  // (2) Distillation: student 512 x 4 layers from the 8-layer teacher; and its LM-only run.
  std::vector<std::string> student = common;
  for (const std::string& key : shape("model", 4)) student.push_back(key);
  const Measured student_lm_only = measure_run(student, steps);
  std::vector<std::string> distill = student;
  for (const std::string& key : shape("teacher", 8)) distill.push_back(key);
  for (const char* key :
       {"teacher.seed=2", "distill.logit_weight=1", "distill.activation_weight=1",
        // The memory-lean chunk (the default, 96, is bench_distill's speed setting): under the
        // optimizer step inside backward the recomputing logit loss's token chunks grow with
        // the vocabulary block, and at 96 they set the all-together peak (+35 MB).
        "distill.chunk_tokens=32",
        "distill.activation_pairs=[layers.0.mixer_output=layers.1.mixer_output,"
        "layers.1.mixer_output=layers.3.mixer_output,layers.2.mixer_output=layers.5.mixer_output,"
        "layers.3.mixer_output=layers.7.mixer_output]"})
    distill.push_back(key);
  std::map<std::string, Measured> distill_runs;
  for (const Variant& v : kVariants) {
    std::vector<std::string> keys = distill;
    keys.insert(keys.end(), v.keys.begin(), v.keys.end());
    distill_runs[v.name] = measure_run(keys, steps);
  }

  // (3) bf16 mixed precision: model (1) under every variant, and the distillation's baseline.
  std::vector<Variant> bf16_variants = kVariants;
  bf16_variants.push_back(kHeadDeferred);
  bf16_variants.insert(bf16_variants.end(), kBf16Only.begin(), kBf16Only.end());
  std::map<std::string, Measured> bf16_runs;
  for (const Variant& v : bf16_variants) {
    std::vector<std::string> keys = lm;
    keys.insert(keys.end(), v.keys.begin(), v.keys.end());
    keys.push_back("model.dtype=bfloat16");
    bf16_runs[v.name] = measure_run(keys, steps);
  }
  std::vector<std::string> distill_bf16 = distill;
  distill_bf16.push_back("model.dtype=bfloat16");
  const Measured distill_bf16_base = measure_run(distill_bf16, steps);

  std::printf(
      "batch 4 x 256 tokens, vocab 32000, %d thread(s), %d measured step(s) per row; "
      "peak = device peak of the measured steps, split at that moment (MB)\n",
      threads, steps);
  std::printf(
      "| setup    | run                   | tokens/s | x base | peak MB | params | bf16 w | grads  "
      "| optim  | activ.  | teacher | teacher | rest   | host   |\n");
  std::printf(
      "|          |                       |          |       |         |        |        |      "
      "  |        |         | weights | activ.  |        | store  |\n");
  std::printf(
      "|----------|-----------------------|----------|-------|---------|--------|--------|-----"
      "---|--------|---------|---------|---------|--------|--------|\n");
  for (const Variant& v : kVariants)
    print_row("LM 39.6M", v.name, lm_runs[v.name], lm_runs["baseline"]);
  print_row("LM 39.6M", kHeadDeferred.name, lm_runs[kHeadDeferred.name], lm_runs["baseline"]);
  print_row("student", "LM only, no teacher", student_lm_only, student_lm_only);
  for (const Variant& v : kVariants)
    print_row("distill", v.name, distill_runs[v.name], student_lm_only);
  for (const Variant& v : bf16_variants)
    print_row("LM bf16", v.name, bf16_runs[v.name], lm_runs["baseline"]);
  print_row("dist bf16", "baseline", distill_bf16_base, student_lm_only);

  // Bytes per parameter of the student by category, at the baseline peaks.
  using C = MemoryCategory;
  std::printf("\nbytes per parameter at the baseline peak (LM 39.6M, %lld parameters):\n",
              (long long)lm_runs["baseline"].parameter_count);
  std::printf(
      "| precision | main weights | bf16 weights | gradients | optimizer | activations |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto& [name, m] :
       {std::pair<const char*, const Measured*>{"fp32", &lm_runs["baseline"]},
        {"bf16", &bf16_runs["baseline"]},
        {"bf16 per use + deferred", &bf16_runs["per use + deferred"]}}) {
    const double n = double(m->parameter_count);
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", name, m->peak.of(C::parameters) / n,
                m->peak.of(C::compute_weights) / n, m->peak.of(C::gradients) / n,
                m->peak.of(C::optimizer_state) / n, m->peak.of(C::activations) / n);
  }

  // The targets.
  const Measured& base = lm_runs["baseline"];
  const double grad_mb = mb(base.trainable_bytes);
  auto lowered = [&](const Measured& from, const Measured& to) {
    return mb(from.peak.device()) - mb(to.peak.device());
  };
  std::printf("\ntargets (LM 39.6M; trainable gradient bytes %.1f MB):\n", grad_mb);
  // In pairs that differ by optimizer.in_backward only. Where the peak falls at the end of
  // forward (no checkpointing) the only gradient is the head's, which the fused head forms
  // there, so the pair shows what little there is to remove; with checkpointing the peak falls
  // in backward, among the gradients.
  // The tied head's float32 gradient (vocab 32000 x hidden 512, both models), which the fused
  // head forms in forward.
  const double head_gradient_mb = mb(int64_t(32000) * 512 * 4);
  auto in_backward_pair = [&](const char* setup, std::map<std::string, Measured>& runs,
                              const char* from, const char* to) {
    const double saved = lowered(runs[from], runs[to]);
    const double trainable = mb(runs[from].trainable_bytes);
    const double at_peak = mb(runs[from].peak.of(C::gradients));
    std::printf(
        "  %s: optimizer in backward lowers the peak (%s -> %s) by %.1f MB = %.0f%% of the "
        "%.1f MB of gradients (%.1f MB of them at the first peak) (target >= 80%%): %s\n",
        setup, from, to, saved, 100 * saved / trainable, trainable, at_peak,
        at_peak > head_gradient_mb + 0.1
            ? verdict(saved >= 0.8 * trainable)
            : "does not apply, that peak is at the end of forward, where the only gradient is "
              "the head's, formed there (what it lowers is that gradient)");
  };
  in_backward_pair("LM 39.6M", lm_runs, "baseline", "optimizer in backward");
  in_backward_pair("LM 39.6M", lm_runs, "offloading (+full)", "all together");
  in_backward_pair("distill", distill_runs, "baseline", "optimizer in backward");
  in_backward_pair("distill", distill_runs, "offloading (+full)", "all together");
  const Measured& offload = lm_runs["offloading (+full)"];
  const double activation_cut =
      1 - double(offload.peak.of(C::activations)) / double(base.peak.of(C::activations));
  const double cost = 1 - offload.tokens_per_s / base.tokens_per_s;
  std::printf(
      "  full checkpointing + offloading: saved activations at the peak %.1f -> %.1f MB "
      "(-%.0f%%, target >= 75%%): %s; throughput cost %.0f%% (target <= 35%%): %s\n",
      mb(base.peak.of(C::activations)), mb(offload.peak.of(C::activations)), 100 * activation_cut,
      verdict(activation_cut >= 0.75), 100 * cost, verdict(cost <= 0.35));
  const Measured& distill_all = distill_runs["all together"];
  std::printf(
      "  distillation with everything on peaks at %.1f MB, the student's LM-only baseline "
      "at %.1f MB (target: below): %s\n",
      mb(distill_all.peak.device()), mb(student_lm_only.peak.device()),
      verdict(distill_all.peak.device() < student_lm_only.peak.device()));
  const Measured& bf16 = bf16_runs["baseline"];
  // Saved activations: the most the step held at once, the device peak being elsewhere in bf16
  // (in backward, among the gradients).
  const double saved_ratio = double(bf16.activations_peak) / double(base.activations_peak);
  const double peak_ratio = double(bf16.peak.device()) / double(base.peak.device());
  std::printf(
      "  bf16 against fp32 (baselines): saved activations at their peak %.1f -> %.1f MB = %.3fx "
      "(target <= 0.55x): %s; peak %.1f -> %.1f MB = %.3fx (target <= 0.8x): %s\n",
      mb(base.activations_peak), mb(bf16.activations_peak), saved_ratio,
      verdict(saved_ratio <= 0.55), mb(base.peak.device()), mb(bf16.peak.device()), peak_ratio,
      verdict(peak_ratio <= 0.8));
  // The same with the bf16 copies cast at each use and the head's gradient deferred: against
  // the fp32 baseline, and against fp32 with its head deferred too (the copies do not exist in
  // fp32).
  const Measured& lean = bf16_runs["per use + deferred"];
  const Measured& deferred = lm_runs[kHeadDeferred.name];
  const double lean_ratio = double(lean.peak.device()) / double(base.peak.device());
  std::printf(
      "  bf16 with copies per use and the head deferred: peak %.1f MB = %.3fx the fp32 baseline "
      "(target <= 0.8x): %s; %.3fx fp32 with its head deferred (%.1f MB); tokens/s %.2fx the "
      "bf16 baseline\n",
      mb(lean.peak.device()), lean_ratio, verdict(lean_ratio <= 0.8),
      double(lean.peak.device()) / double(deferred.peak.device()), mb(deferred.peak.device()),
      lean.tokens_per_s / bf16.tokens_per_s);

  // What the two keys cost in throughput: alternated single steps, trainers alive together.
  constexpr int kRounds = 10;
  auto with = [&](std::vector<std::string> keys, std::vector<std::string> more) {
    keys.insert(keys.end(), more.begin(), more.end());
    return keys;
  };
  std::vector<std::string> lm_bf16 = with(lm, {"model.dtype=bfloat16"});
  const std::vector<Variant> alternated = {
      {"bf16 baseline", lm_bf16},
      {"bf16 copies per use", with(lm_bf16, kBf16Only[0].keys)},
      {"bf16 per use + deferred", with(lm_bf16, kBf16Only[1].keys)},
  };
  std::vector<std::vector<std::string>> bf16_keys, fp32_keys = {lm, with(lm, kHeadDeferred.keys)};
  for (const Variant& v : alternated) bf16_keys.push_back(v.keys);
  const auto bf16_ratios = alternated_ratios(bf16_keys, kRounds);
  const auto fp32_ratios = alternated_ratios(fp32_keys, kRounds);
  std::printf("\nthroughput against the baseline, alternated single steps, %d rounds:\n", kRounds);
  auto print_ratios = [](const std::string& name, std::vector<double> ratios) {
    std::printf("  %-32s:", name.c_str());
    for (double r : ratios) std::printf(" %.3f", r);
    std::sort(ratios.begin(), ratios.end());
    std::printf("; median %.3f (%.3f-%.3f)\n", bench::median(ratios), ratios.front(),
                ratios.back());
  };
  for (size_t k = 1; k < alternated.size(); ++k)
    print_ratios(std::string(alternated[k].name) + " / bf16 baseline", bf16_ratios[k]);
  print_ratios("fp32 head deferred / fp32 baseline", fp32_ratios[1]);
  return 0;
}

int main(int argc, char** argv) {
  return bench::main_reporting_errors(measure, argc, argv);
}
