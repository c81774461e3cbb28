// bench/bench_adamw.cpp: whether Retort's one-pass AdamW loop (engine/optim/adamw_kernel.h,
// split over torch's threads as AdamW::update splits it) still beats what libtorch offers:
// ATen's fused CPU AdamW (at::_fused_adamw_, what torch.optim.AdamW(fused=True) runs) and
// the composed torch ops (torch.optim.AdamW's foreach form, op by op). The parameters are the
// issue-12 model's tensors (its 8 layers' weights and norms and the tied embedding); one
// step of each way, alternated in every round, best of the rounds; the results of the two
// fused ways are checked against each other first.
// Usage: bench_adamw [threads=cores] [rounds=5]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "engine/optim/adamw_kernel.h"

using namespace retort;

namespace {

constexpr double kLr = 3e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kDecay = 0.1;

struct Set {
  std::vector<torch::Tensor> value, grad, m, v;
};

Set make_set(const std::vector<std::vector<int64_t>>& shapes) {
  torch::manual_seed(0);
  Set s;
  for (const auto& shape : shapes) {
    s.value.push_back(torch::randn(shape) * 0.02);
    s.grad.push_back(torch::randn(shape) * 1e-3);
    s.m.push_back(torch::zeros(shape));
    s.v.push_back(torch::zeros(shape));
  }
  return s;
}

// Retort's loop, as AdamW::update runs it: per tensor, chunks of 2^15 over torch's threads.
void ours(Set& s, int64_t step) {
  engine::kernels::AdamWCoefficients c{};
  c.decay_factor = 1 - kLr * kDecay;
  c.beta1 = kBeta1;
  c.beta2 = kBeta2;
  c.eps = kEps;
  c.sqrt_bias2 = std::sqrt(1 - std::pow(kBeta2, double(step)));
  c.step_scale = -kLr / (1 - std::pow(kBeta1, double(step)));
  for (size_t i = 0; i < s.value.size(); ++i) {
    float* value = s.value[i].data_ptr<float>();
    const float* g = s.grad[i].data_ptr<float>();
    float *m = s.m[i].data_ptr<float>(), *v = s.v[i].data_ptr<float>();
    at::parallel_for(0, s.value[i].numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      engine::kernels::adamw_update(value + begin, g + begin, m + begin, v + begin, end - begin, c);
    });
  }
}

void aten_fused(Set& s, std::vector<torch::Tensor>& steps) {
  for (auto& t : steps) t.add_(1);
  at::_fused_adamw_(s.value, s.grad, s.m, s.v, {}, steps, kLr, kBeta1, kBeta2, kDecay, kEps, false,
                    false);
}

// torch.optim.AdamW's update written op by op (its foreach form does the same passes).
void composed(Set& s, int64_t step) {
  const double bias1 = 1 - std::pow(kBeta1, double(step));
  const double sqrt_bias2 = std::sqrt(1 - std::pow(kBeta2, double(step)));
  for (size_t i = 0; i < s.value.size(); ++i) {
    s.value[i].mul_(1 - kLr * kDecay);
    s.m[i].lerp_(s.grad[i], 1 - kBeta1);
    s.v[i].mul_(kBeta2).addcmul_(s.grad[i], s.grad[i], 1 - kBeta2);
    const torch::Tensor denominator = (s.v[i].sqrt() / sqrt_bias2).add_(kEps);
    s.value[i].addcdiv_(s.m[i], denominator, -kLr / bias1);
  }
}

double seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  setup_process(argv);
  const int threads =
      int(bench::count_argument(argc, argv, 1, "threads", std::thread::hardware_concurrency()));
  const int rounds = int(bench::count_argument(argc, argv, 2, "rounds", 5));
  set_compute_threads(threads);
  torch::NoGradGuard no_grad;
  const int64_t hidden = 512, ffn = 1536, vocab = 32000, layers = 8;
  std::vector<std::vector<int64_t>> shapes = {{vocab, hidden}, {hidden}};
  for (int64_t l = 0; l < layers; ++l) {
    shapes.push_back({3 * hidden, hidden});
    shapes.push_back({hidden, hidden});
    shapes.push_back({2 * ffn, hidden});
    shapes.push_back({hidden, ffn});
    shapes.push_back({hidden});
    shapes.push_back({hidden});
  }
  Set a = make_set(shapes), b = make_set(shapes), c = make_set(shapes);
  std::vector<torch::Tensor> steps;
  for (size_t i = 0; i < shapes.size(); ++i) steps.push_back(torch::zeros({}));
  int64_t parameters = 0;
  for (const auto& t : a.value) parameters += t.numel();

  // One step of each from the same state must agree (fp32 round-off).
  ours(a, 1);
  aten_fused(b, steps);
  double worst = 0;
  for (size_t i = 0; i < shapes.size(); ++i)
    worst = std::max(
        worst, ((a.value[i] - b.value[i]).abs().max() / b.value[i].abs().max()).item<double>());
  if (worst > 1e-5) {
    std::printf("ours and ATen's fused AdamW differ by %.2e (relative)\n", worst);
    return 1;
  }
  double best[3] = {1e30, 1e30, 1e30};
  for (int round = 0; round < rounds; ++round) {
    const int64_t step = round + 2;
    best[0] = std::min(best[0], seconds([&] { ours(a, step); }));
    best[1] = std::min(best[1], seconds([&] { aten_fused(b, steps); }));
    best[2] = std::min(best[2], seconds([&] { composed(c, step); }));
  }
  const char* names[3] = {"Retort's one-pass loop", "ATen's fused AdamW (_fused_adamw_)",
                          "composed torch ops"};
  std::printf("AdamW step over %lld fp32 parameters, %d thread(s), best of %d rounds\n",
              static_cast<long long>(parameters), threads, rounds);
  std::printf("| way | ms | GB/s (4 read + 3 written floats a value) |\n|---|---|---|\n");
  for (int w = 0; w < 3; ++w)
    std::printf("| %s | %.1f | %.1f |\n", names[w], best[w] * 1e3,
                7.0 * 4 * double(parameters) / best[w] / 1e9);
  return 0;
}
