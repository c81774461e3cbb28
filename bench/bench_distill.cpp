// bench/bench_distill.cpp: the cost of distillation for one student in one invocation:
// tokens/s and peak tensor memory of full training steps with (1) the LM loss only,
// (2) + logit distillation (forward KL), (3) + activation distillation (every student
// layer's mixer output against the teacher's, through projections), (4) logit distillation
// from a teacher cache (the teacher's top 64 per position, written once before by
// engine_teacher_cache's writer; no teacher weights loaded), next to the targets:
// throughput >= 0.95 x the FLOP ideal 6Ns / (6Ns + 2Nt) of the LM-only rate (from the cache:
// >= 0.9 x the LM-only rate), and peak memory <= LM-only peak + the teacher's weights + 10% of
// the LM-only peak. The cache's bytes per token are printed with it.
// Teacher: hidden 512, 8 layers. Student (default): the teacher's width with half its depth
// (DistilBERT-style), layer i distilled from teacher layer 2i+1; with "narrow" as third
// argument, hidden 384 and 6 layers, whose activation pairs need learned projections.
// Vocab 32000, seq 256, micro-batch 4.
// Each mode runs in three interleaved rounds and reports its best rate and largest peak.
// Then the four Trainers are kept alive together and single steps of them alternate for 12
// rounds (the order rotating), and the median of the rounds' ratios to the LM-only step is
// printed: a best-of-rounds ratio rests on the luckiest LM-only round, and this machine's
// speed moves by 5-20% between minutes (the sequence benchmark measures the same way).
// Every mode is the real Trainer on random tokens, built from config assignments.
// Usage: bench_distill [steps=4] [threads=cores] [narrow] [key=value ...] (keys added to every
// mode, e.g. model.dtype=bfloat16)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "bench_args.h"
#include "bench_setup.h"
#include "common/compute_threads.h"
#include "common/user_error.h"
#include "engine/observe/memory_tracker.h"
#include "engine/teacher_cache/cache_command.h"
#include "engine/teacher_cache/cache_store.h"
#include "engine/train/trainer.h"

using namespace retort;

namespace {

struct Result {
  double tokens_per_s = 0;
  int64_t peak = 0;
};

// The model keys of a shape: vocab 32000, kv heads half the heads, tied embeddings.
std::vector<std::string> shape(const std::string& prefix, int64_t hidden, int64_t layers,
                               int64_t heads, int64_t ffn) {
  return {prefix + ".hidden=" + std::to_string(hidden),
          prefix + ".layers=" + std::to_string(layers), prefix + ".heads=" + std::to_string(heads),
          prefix + ".kv_heads=" + std::to_string(heads / 2),
          prefix + ".ffn_hidden=" + std::to_string(ffn)};
}

}  // namespace

int measure(int argc, char** argv) {
  const int steps = int(bench::count_argument(argc, argv, 1, "steps", 4));
  const int threads =
      int(bench::count_argument(argc, argv, 2, "threads", std::thread::hardware_concurrency()));
  set_compute_threads(threads);
  engine::MemoryTracker& memory = engine::MemoryTracker::install();
  bool narrow = false;
  std::vector<std::string> user_keys;  // key=value arguments: added to every mode
  for (int i = 3; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "narrow")
      narrow = true;
    else if (argument.find('=') != std::string::npos)
      user_keys.push_back(argument);
    else
      throw UserError("bench_distill: argument '" + argument +
                      "' is neither 'narrow' nor a key=value assignment");
  }
  const int64_t teacher_layers = 8, student_layers = narrow ? 6 : 4;
  const std::string dir =
      (std::filesystem::temp_directory_path() / "retort_bench_distill").string();
  std::vector<std::string> common = bench::measured_run_keys(dir, steps);
  for (const char* key : {"distill.chunk_tokens=192", "teacher.seed=2"}) common.push_back(key);
  common.insert(common.end(), user_keys.begin(), user_keys.end());
  for (const auto& keys :
       {narrow ? shape("model", 384, 6, 6, 1024) : shape("model", 512, 4, 8, 1376),
        shape("teacher", 512, teacher_layers, 8, 1376)})
    common.insert(common.end(), keys.begin(), keys.end());
  std::string pairs = "distill.activation_pairs=[";  // student layer i <- the last teacher
  for (int64_t i = 0; i < student_layers; ++i)       // layer of its span
    pairs += std::string(i ? "," : "") + "layers." + std::to_string(i) + ".mixer_output=layers." +
             std::to_string(((i + 1) * teacher_layers) / student_layers - 1) + ".mixer_output";
  pairs += "]";

  int64_t teacher_bytes = 0;
  double ns = 0, nt = 0;
  constexpr int kRounds = 12;
  // The teacher cache mode (4) reads: the teacher's top 64 over every sample the runs draw.
  const std::string cache = dir + "/teacher_cache";
  const std::vector<std::string> from_cache = {"teacher.cache=" + cache,
                                               "distill.teacher_top_k=64"};
  // extra: assignments after the common ones (a later assignment of a key wins).
  auto config_of = [&](double logit_weight, double activation_weight,
                       const std::vector<std::string>& extra) {
    std::vector<std::string> assignments = common;
    assignments.push_back("distill.logit_weight=" + std::to_string(logit_weight));
    assignments.push_back("distill.activation_weight=" + std::to_string(activation_weight));
    if (activation_weight > 0) assignments.push_back(pairs);
    assignments.insert(assignments.end(), extra.begin(), extra.end());
    return bench::bench_config(assignments);
  };
  {
    std::filesystem::remove_all(cache);
    engine::TrainConfig config = config_of(1, 0, {"distill.teacher_top_k=64"});
    engine::TeacherCacheRequest request;
    request.out = cache;
    request.samples =
        std::max<int64_t>(config.training.steps, kRounds + 3) * config.training.global_batch;
    std::unique_ptr<parallel::Mesh> mesh = parallel::Mesh::single_process();
    engine::write_teacher_cache(config, request, *mesh, nullptr);
  }
  const engine::TeacherCacheShape cache_shape = engine::TeacherCacheReader(cache).header().shape;
  auto run = [&](double logit_weight, double activation_weight, bool cached) {
    const engine::TrainConfig config = config_of(logit_weight, activation_weight,
                                                 cached ? from_cache : std::vector<std::string>{});
    ns = double(config.model.parameter_count());
    nt = double(config.distill.teacher.parameter_count());
    // Only distillation runs hold a teacher, so the LM-only peak excludes its weights.
    engine::Trainer trainer(config, nullptr);
    if (trainer.teacher()) teacher_bytes = trainer.teacher()->weight_bytes();
    trainer.train_step();  // warm-up
    memory.reset_peak();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) trainer.train_step();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return Result{double(steps * config.training.global_batch * config.data.seq_len) / s,
                  memory.peak_bytes()};
  };

  // Three interleaved rounds; each mode keeps its best rate (least disturbed by the machine)
  // and its largest peak.
  Result lm, logits, both, cached;
  int64_t cached_teacher_bytes = 0;
  auto keep = [](Result& best, const Result& r) {
    best.tokens_per_s = std::max(best.tokens_per_s, r.tokens_per_s);
    best.peak = std::max(best.peak, r.peak);
  };
  for (int round = 0; round < 3; ++round) {
    keep(lm, run(0, 0, false));
    keep(logits, run(1, 0, false));
    keep(both, run(1, 1, false));
    const int64_t online_teacher_bytes = teacher_bytes;
    teacher_bytes = 0;
    keep(cached, run(1, 0, true));
    cached_teacher_bytes = std::max(cached_teacher_bytes, teacher_bytes);
    teacher_bytes = online_teacher_bytes;
  }
  // Alternated single steps, the four Trainers alive together (each its own run directory).
  constexpr int kModes = 4;
  const double modes[kModes][3] = {{0, 0, 0}, {1, 0, 0}, {1, 1, 0}, {1, 0, 1}};
  std::unique_ptr<engine::Trainer> trainers[kModes];
  for (int m = 0; m < kModes; ++m) {
    std::vector<std::string> extra = {"training.steps=" + std::to_string(kRounds + 3),
                                      "run.dir=" + dir + "/alternated" + std::to_string(m)};
    if (modes[m][2] > 0) extra.insert(extra.end(), from_cache.begin(), from_cache.end());
    trainers[m] =
        std::make_unique<engine::Trainer>(config_of(modes[m][0], modes[m][1], extra), nullptr);
  }
  for (int warm = 0; warm < 2; ++warm)
    for (auto& trainer : trainers) trainer->train_step();
  std::vector<double> round_ratios[kModes];  // [mode]: LM-only step time / the mode's
  for (int round = 0; round < kRounds; ++round) {
    double seconds[kModes];
    for (int i = 0; i < kModes; ++i) {
      const int m = (round + i) % kModes;  // the order rotating
      const auto start = std::chrono::steady_clock::now();
      trainers[m]->train_step();
      seconds[m] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    for (int m = 1; m < kModes; ++m) round_ratios[m].push_back(seconds[0] / seconds[m]);
  }

  const double ideal = 6 * ns / (6 * ns + 2 * nt);
  const double teacher_mb = double(teacher_bytes) / 1e6;
  const double budget = lm.peak / 1e6 + teacher_mb + 0.1 * lm.peak / 1e6;
  std::printf(
      "student %.1fM parameters, teacher %.1fM, vocab 32000, batch %lld x seq %lld, "
      "%d thread(s)\n",
      ns / 1e6, nt / 1e6, 4LL, 256LL, threads);
  std::printf("FLOP ideal throughput ratio 6Ns/(6Ns+2Nt) = %.3f; target >= %.3f\n", ideal,
              0.95 * ideal);
  std::printf("memory target: <= LM-only peak + teacher weights (%.1f MB) + 10%% = %.1f MB\n",
              teacher_mb, budget);
  std::printf(
      "| run                    | tokens/s | ratio to LM | target ratio | peak MB | "
      "machinery MB (peak - LM - teacher) | budget MB |\n");
  std::printf(
      "|------------------------|----------|-------------|--------------|---------|"
      "-------------------------------------|-----------|\n");
  struct Row {
    const char* name;
    Result r;
    double teacher_mb, target;  // the teacher weights it holds; its throughput target
  };
  for (const Row& row : {Row{"LM loss only", lm, 0, 0},
                         Row{"+ logit distillation", logits, teacher_mb, 0.95 * ideal},
                         Row{"+ logit + activation", both, teacher_mb, 0.95 * ideal},
                         Row{"+ logit, teacher cache", cached, cached_teacher_bytes / 1e6, 0.9}}) {
    char target[16] = "-", machinery[16] = "-", allowed[16] = "-";
    if (row.target > 0) {
      std::snprintf(target, sizeof(target), "%.3f", row.target);
      std::snprintf(machinery, sizeof(machinery), "%.1f",
                    row.r.peak / 1e6 - lm.peak / 1e6 - row.teacher_mb);
      std::snprintf(allowed, sizeof(allowed), "%.1f", 0.1 * lm.peak / 1e6);
    }
    std::printf("| %-22s | %8.0f | %11.3f | %12s | %7.1f | %35s | %9s |\n", row.name,
                row.r.tokens_per_s, row.r.tokens_per_s / lm.tokens_per_s, target, row.r.peak / 1e6,
                machinery, allowed);
  }
  std::printf("alternated single steps, %d rounds, each round's ratio to the LM-only step:\n",
              kRounds);
  const char* names[kModes] = {"", "+ logit distillation", "+ logit + activation",
                               "+ logit, teacher cache"};
  for (int m = 1; m < kModes; ++m) {
    std::printf("  %-22s:", names[m]);
    for (double r : round_ratios[m]) std::printf(" %.3f", r);
    const double med = bench::median(round_ratios[m]);
    const double target = modes[m][2] > 0 ? 0.9 : 0.95 * ideal;
    std::printf("; median %.3f (target %.3f: %s)\n", med, target,
                med >= target ? "met" : "NOT met");
  }
  std::printf(
      "teacher cache: top %lld of %lld ids, float16 values, %.1f bytes per token; teacher "
      "weights held by the student from the cache: %lld bytes\n",
      static_cast<long long>(cache_shape.top_k), static_cast<long long>(cache_shape.vocab_size),
      double(engine::record_bytes(cache_shape)) / double(cache_shape.seq_len),
      static_cast<long long>(cached_teacher_bytes));
  return 0;
}

int main(int argc, char** argv) {
  return bench::main_reporting_errors(measure, argc, argv);
}
