// bench/bench_distill.cpp: the cost of distillation for one student in one invocation:
// tokens/s and peak tensor memory of full training steps with (1) the LM loss only,
// (2) + logit distillation (forward KL), (3) + activation distillation (every student
// layer's mixer output against the teacher's, through projections), next to the targets:
// throughput >= 0.95 x the FLOP ideal 6Ns / (6Ns + 2Nt) of the LM-only rate, and peak
// memory <= LM-only peak + the teacher's weights + 10% of the LM-only peak.
// Teacher: hidden 512, 8 layers. Student (default): the teacher's width with half its depth
// (DistilBERT-style), layer i distilled from teacher layer 2i+1; with "narrow" as third
// argument, hidden 384 and 6 layers, whose activation pairs need learned projections.
// Vocab 32000, seq 256, micro-batch 4.
// Each mode runs in three interleaved rounds and reports its best rate and largest peak.
// Usage: bench_distill [steps=4] [threads=cores] [narrow]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "distill/distillation.h"
#include "engine/adamw.h"
#include "engine/memory_tracker.h"

using namespace retort;

namespace {

struct Result {
  double tokens_per_s = 0;
  int64_t peak = 0;
};

layers::ModelConfig make(int64_t hidden, int64_t layers, int64_t heads, int64_t ffn) {
  layers::ModelConfig c;
  c.vocab_size = 32000;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = heads / 2;
  c.ffn_hidden = ffn;
  c.tied_embeddings = true;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 4;
  const int threads = argc > 2 ? std::atoi(argv[2]) : int(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);
  engine::MemoryTracker& memory = engine::MemoryTracker::install();
  const bool narrow = argc > 3 && std::string(argv[3]) == "narrow";
  const layers::ModelConfig tc = make(512, 8, 8, 1376);
  const layers::ModelConfig sc = narrow ? make(384, 6, 6, 1024) : make(512, 4, 8, 1376);
  const int64_t batch = 4, seq = 256;
  torch::Tensor tokens = torch::randint(sc.vocab_size, {batch, seq + 1}, torch::kLong);
  torch::Tensor inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq).contiguous();

  std::vector<std::string> pairs;  // student layer i <- the last teacher layer of its span
  for (int64_t i = 0; i < sc.layers; ++i)
    pairs.push_back(layers::capture_name(i, "mixer_output") + "=" +
                    layers::capture_name(((i + 1) * tc.layers) / sc.layers - 1, "mixer_output"));

  int64_t teacher_bytes = 0;
  auto run = [&](double logit_weight, double activation_weight) {
    layers::ParameterStore store(1, torch::kFloat);
    layers::LlamaModel student(sc, store);
    // Only distillation runs hold a teacher, so the LM-only peak excludes its weights.
    std::unique_ptr<distill::Teacher> teacher;
    std::unique_ptr<distill::Distiller> distiller;
    if (logit_weight > 0 || activation_weight > 0) {
      teacher = std::make_unique<distill::Teacher>(tc, 2, torch::kFloat, layers::TensorParallel{});
      teacher_bytes = teacher->weight_bytes();
      distill::DistillConfig dc;
      dc.logit_weight = logit_weight;
      dc.activation_weight = activation_weight;
      dc.logits.chunk_tokens = 32;
      if (activation_weight > 0)
        dc.pairs = distill::make_activation_pairs(pairs, {}, sc.layers, tc.layers);
      distiller = std::make_unique<distill::Distiller>(dc, *teacher, sc, store,
                                                       layers::TensorParallel{});
    }
    engine::OptimizerConfig oc;
    engine::AdamW adam(store, oc);
    const double count = double(batch * seq);
    auto step = [&] {
      for (auto& p : store.all())
        if (p.value.grad().defined()) p.value.mutable_grad().reset();
      distill::LossTerms terms;
      torch::Tensor loss;
      if (!distiller) {
        loss = student.loss_sum(inputs, targets) / count;
      } else {
        layers::CaptureSink teacher_sink(distiller->teacher_captures());
        layers::CaptureSink student_sink(distiller->student_captures());
        torch::Tensor teacher_logits = teacher->forward(inputs, &teacher_sink);
        torch::Tensor logits = student.forward(inputs, &student_sink);
        loss = distiller->loss(logits, teacher_logits, targets, student_sink, teacher_sink, count,
                               sc.vocab_size, &terms);
      }
      loss.backward();
      engine::clip_grad_norm(store, 1.0);
      adam.begin_step();
      adam.step_all(1e-4);
    };
    step();  // warm-up
    memory.reset_peak();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return Result{double(steps * batch * seq) / s, memory.peak_bytes()};
  };

  // Three interleaved rounds; each mode keeps its best rate (least disturbed by the machine)
  // and its largest peak.
  Result lm, logits, both;
  auto keep = [](Result& best, const Result& r) {
    best.tokens_per_s = std::max(best.tokens_per_s, r.tokens_per_s);
    best.peak = std::max(best.peak, r.peak);
  };
  for (int round = 0; round < 3; ++round) {
    keep(lm, run(0, 0));
    keep(logits, run(1, 0));
    keep(both, run(1, 1));
  }
  const double ns = double(sc.parameter_count()), nt = double(tc.parameter_count());
  const double ideal = 6 * ns / (6 * ns + 2 * nt);
  const double teacher_mb = double(teacher_bytes) / 1e6;
  const double budget = lm.peak / 1e6 + teacher_mb + 0.1 * lm.peak / 1e6;
  std::printf("student %.1fM parameters, teacher %.1fM, vocab 32000, batch %lld x seq %lld, "
              "%d thread(s)\n",
              ns / 1e6, nt / 1e6, (long long)batch, (long long)seq, threads);
  std::printf("FLOP ideal throughput ratio 6Ns/(6Ns+2Nt) = %.3f; target >= %.3f\n", ideal,
              0.95 * ideal);
  std::printf("memory target: <= LM-only peak + teacher weights (%.1f MB) + 10%% = %.1f MB\n",
              teacher_mb, budget);
  std::printf("| run                   | tokens/s | ratio to LM | target ratio | peak MB | "
              "machinery MB (peak - LM - teacher) | budget MB |\n");
  std::printf("|-----------------------|----------|-------------|--------------|---------|"
              "-------------------------------------|-----------|\n");
  for (auto [name, r] : {std::pair<const char*, Result>{"LM loss only", lm},
                         {"+ logit distillation", logits},
                         {"+ logit + activation", both}}) {
    const bool is_lm = r.peak == lm.peak && r.tokens_per_s == lm.tokens_per_s;
    char target[16] = "-", machinery[16] = "-", allowed[16] = "-";
    if (!is_lm) {
      std::snprintf(target, sizeof(target), "%.3f", 0.95 * ideal);
      std::snprintf(machinery, sizeof(machinery), "%.1f", r.peak / 1e6 - lm.peak / 1e6 - teacher_mb);
      std::snprintf(allowed, sizeof(allowed), "%.1f", 0.1 * lm.peak / 1e6);
    }
    std::printf("| %-21s | %8.0f | %11.3f | %12s | %7.1f | %35s | %9s |\n", name, r.tokens_per_s,
                r.tokens_per_s / lm.tokens_per_s, target, r.peak / 1e6, machinery, allowed);
  }
  return 0;
}
