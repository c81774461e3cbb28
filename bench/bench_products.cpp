// bench/bench_products.cpp: whether a matrix product of our own could beat the BLAS on the
// step's linear products (the ceiling bench_throughput and bench/peer/run_peer.py report).
// For each linear shape of the issue-12 model (tokens x hidden -> out, forward y = x W^T,
// input gradient dx = dy W, weight gradient dW += dy^T x), three ways, alternating in each
// round, best of the rounds:
//  - blas:      torch::mm_out / addmm_ (libtorch's BLAS, MKL in the wheel, as the step calls it);
//  - tile:      kernels/tile_gemm.h's AVX-512 register blocks, the output's 32-column panels split
//               over the threads, each thread packing its own panels of B inside the call (what an
//               engine using it would pay each time);
//  - tile, B packed beforehand: the same with the packing outside the timing, the most any
//               scheme that packs B less often (once per step for a weight) could gain.
// The last row weighs each kind by its FLOPs in one step, as the step runs them; the line
// after it is the bound for an engine that picks the fastest way product by product, and the
// CPU's FMA peak (independent AVX-512 FMAs, no memory) the bound for any product at all.
// Usage: bench_products [threads=cores] [rounds=3] [tokens=1024] [head_chunk=256]
// (head_chunk: the LM head's chunk of tokens; distillation's default is 192)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "engine/observe/compute_peak.h"
#include "kernels/tile_gemm.h"

using namespace retort;

namespace {

// C[m, n] (+)= A B with A element (i, p) at a[i * a_row + p * a_col] and B element (p, c) at
// b[p * b_row + c * b_col]; `packed` holds B's panels (k * round_up(n, 32) floats): packed
// inside when pack is true, else taken as packed already.
void tile_product(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                  const float* b, int64_t b_row, int64_t b_col, bool accumulate, float* c,
                  float* packed, bool pack) {
  const int64_t panels = (n + kernels::kPanelColumns - 1) / kernels::kPanelColumns;
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t j = first; j < last; ++j) {
      const int64_t c0 = j * kernels::kPanelColumns;
      const int64_t width = std::min(kernels::kPanelColumns, n - c0);
      float* panel = packed + j * kernels::kPanelColumns * k;
      if (pack) kernels::pack_panels(b + c0 * b_col, b_row, b_col, k, width, panel);
      kernels::tile_gemm(m, width, k, 1.0f, a, a_row, a_col, {panel, kernels::kPanelColumns * k},
                         accumulate, c + c0, n);
    }
  });
}

double best_seconds(const std::function<void()>& f, int repeats) {
  f();  // warm-up
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

struct Shape {
  std::string name;
  int64_t m, k, n, per_step;  // per_step: how many times one step runs it
};

constexpr int kKinds = 3, kWays = 3;
const char* const kKindNames[kKinds] = {"forward x W^T", "input grad dy W", "weight grad dy^T x"};
const char* const kWayNames[kWays] = {"blas", "tile", "tile, B packed beforehand"};

}  // namespace

int main(int argc, char** argv) {
  setup_process(argv);
  const int threads =
      int(bench::count_argument(argc, argv, 1, "threads", std::thread::hardware_concurrency()));
  const int rounds = int(bench::count_argument(argc, argv, 2, "rounds", 3));
  const int64_t tokens = bench::count_argument(argc, argv, 3, "tokens", 1024);
  const int64_t head_chunk = bench::count_argument(argc, argv, 4, "head_chunk", 256);
  set_compute_threads(threads);
  if (!kernels::tile_gemm_available()) {
    std::printf("this CPU has no AVX-512: tile_gemm runs as plain loops, nothing to compare\n");
    return 0;
  }
  torch::NoGradGuard no_grad;
  const int64_t layers = 8, hidden = 512, ffn = 1536, vocab = 32000;
  const std::vector<Shape> shapes = {
      {"q|k|v", tokens, hidden, 3 * hidden, layers},
      {"o_proj", tokens, hidden, hidden, layers},
      {"gate|up", tokens, hidden, 2 * ffn, layers},
      {"down", tokens, ffn, hidden, layers},
      {"LM head chunk", head_chunk, hidden, vocab, tokens / head_chunk},
  };
  // seconds[shape][kind][way], best over rounds
  std::vector<double> best(shapes.size() * kKinds * kWays, 1e30);
  auto at = [&](size_t s, int kind, int way) -> double& {
    return best[(s * kKinds + kind) * kWays + way];
  };
  for (int round = 0; round < rounds; ++round) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      const Shape& sh = shapes[s];
      const int64_t m = sh.m, k = sh.k, n = sh.n;
      torch::Tensor x = torch::randn({m, k}), w = torch::randn({n, k}) * 0.02,
                    dy = torch::randn({m, n});
      torch::Tensor y = torch::empty({m, n}), dx = torch::empty({m, k}), dw = torch::zeros({n, k});
      // B's panels: W^T (k x n), W (n x k) or x (m x k), columns rounded up to a panel.
      std::vector<float> packed(size_t(std::max({k * (n + 32), n * (k + 32), m * (k + 32)})));
      const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *dyp = dy.data_ptr<float>();
      // Each kind as (BLAS call, own call with pack flag, a packing call for "beforehand").
      const std::function<void()> blas[kKinds] = {[&] { torch::mm_out(y, x, w.t()); },
                                                  [&] { torch::mm_out(dx, dy, w); },
                                                  [&] { dw.addmm_(dy.t(), x); }};
      const std::function<void(bool)> own[kKinds] = {
          [&](bool pack) {
            tile_product(m, n, k, xp, k, 1, wp, 1, k, false, y.data_ptr<float>(), packed.data(),
                         pack);
          },
          [&](bool pack) {
            tile_product(m, k, n, dyp, n, 1, wp, k, 1, false, dx.data_ptr<float>(), packed.data(),
                         pack);
          },
          [&](bool pack) {
            tile_product(n, k, m, dyp, 1, n, xp, k, 1, true, dw.data_ptr<float>(), packed.data(),
                         pack);
          }};
      for (int kind = 0; kind < kKinds; ++kind) {
        // Check the own products against the BLAS once per shape and kind, so the table never
        // times a wrong product.
        if (round == 0) {
          dw.zero_();
          blas[kind]();
          const torch::Tensor expected = (kind == 0 ? y : kind == 1 ? dx : dw).clone();
          dw.zero_();
          own[kind](true);
          const torch::Tensor got = kind == 0 ? y : kind == 1 ? dx : dw;
          const double error =
              (got - expected).abs().max().item<double>() / expected.abs().max().item<double>();
          if (error > 1e-4) {
            std::printf("%s %s, %s: differs from the BLAS by %.2e (relative)\n", sh.name.c_str(),
                        kKindNames[kind], kWayNames[1], error);
            return 1;
          }
        }
        const int repeats = 5;
        at(s, kind, 0) = std::min(at(s, kind, 0), best_seconds(blas[kind], repeats));
        at(s, kind, 1) = std::min(at(s, kind, 1), best_seconds([&] { own[kind](true); }, repeats));
        own[kind](true);  // pack once; the timed calls below reuse the panels
        at(s, kind, 2) = std::min(at(s, kind, 2), best_seconds([&] { own[kind](false); }, repeats));
      }
    }
    std::fprintf(stderr, "  round %d of %d measured\n", round + 1, rounds);
  }
  std::printf("fp32 GFLOP/s, %d thread(s), %lld tokens, best of %d rounds\n", threads,
              static_cast<long long>(tokens), rounds);
  std::printf("| product | kind | %s | %s | %s |\n|---|---|---|---|---|\n", kWayNames[0],
              kWayNames[1], kWayNames[2]);
  double step_flops = 0, step_seconds[kWays] = {0, 0, 0}, fastest_seconds = 0;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const Shape& sh = shapes[s];
    const double flops = 2.0 * double(sh.m) * double(sh.k) * double(sh.n);
    for (int kind = 0; kind < kKinds; ++kind) {
      std::printf("| %s %lldx%lldx%lld | %s |", sh.name.c_str(), static_cast<long long>(sh.m),
                  static_cast<long long>(sh.k), static_cast<long long>(sh.n), kKindNames[kind]);
      for (int way = 0; way < kWays; ++way) {
        std::printf(" %.0f |", flops / at(s, kind, way) / 1e9);
        step_seconds[way] += double(sh.per_step) * at(s, kind, way);
      }
      fastest_seconds +=
          double(sh.per_step) * std::min({at(s, kind, 0), at(s, kind, 1), at(s, kind, 2)});
      std::printf("\n");
      step_flops += double(sh.per_step) * flops;
    }
  }
  std::printf("| one step's products | all |");
  for (int way = 0; way < kWays; ++way)
    std::printf(" %.0f (%.3f s) |", step_flops / step_seconds[way] / 1e9, step_seconds[way]);
  std::printf("\n");
  const engine::ComputePeak compute = engine::measure_compute_peak(threads);
  const double peak = compute.gflops;
  std::printf("\nFMA peak (%s): %.0f GFLOP/s, %.2fx the BLAS's step products\n",
              compute.how.c_str(), peak, peak / (step_flops / step_seconds[0] / 1e9));
  // The bound for an engine that picks, per product, the fastest of the three.
  std::printf("fastest way per product: %.0f GFLOP/s (%.3f s), %.2fx the BLAS alone\n",
              step_flops / fastest_seconds / 1e9, fastest_seconds,
              step_seconds[0] / fastest_seconds);
  return 0;
}
