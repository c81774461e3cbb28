// bench/bench_attention.cpp: the causal attention core alone, forward and backward, at one
// sequence length: layers::blocked_attention (fused CPU kernels) for several query-block and
// key-tile sizes (and the default one with its tile products through the BLAS instead of
// kernels/tile_gemm.h), ATen's scaled_dot_product_attention (causal; libtorch 2.x's fused CPU
// kernel, alternated with the default blocked form) and the dense grouped attention, each
// timed over a few repetitions after a warm-up, with GFLOP/s counted as the training FLOP count
// does (QK^T and PV over the causal half: 4 h d s(s+1)/2 forward, twice that backward; the
// recomputed scores not counted). Usage: bench_attention [seq=2048] [threads=cores] [heads=8]
// [batch=1]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "common/compute_threads.h"
#include "common/process_setup.h"
#include "layers/blocked_attention.h"
#include "layers/functional.h"
#include "kernels/tile_gemm.h"

using namespace retort;

namespace {

double seconds(const std::function<void()>& f, int repeats) {
  f();  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

}  // namespace

int main(int argc, char** argv) {
  setup_process(argv);
  const int64_t s = bench::count_argument(argc, argv, 1, "sequence length", 2048);
  const int threads =
      int(bench::count_argument(argc, argv, 2, "threads", std::thread::hardware_concurrency()));
  const int64_t heads = bench::count_argument(argc, argv, 3, "heads", 8),
                b = bench::count_argument(argc, argv, 4, "batch", 1);
  const int64_t d = 64;
  set_compute_threads(threads);
  torch::manual_seed(0);
  // Laid out as the attention makes them: views of one packed [b, s, 3 * heads * d] product.
  torch::Tensor qkv = torch::randn({b, s, 3 * heads * d});
  auto part = [&](int i) {
    return qkv.narrow(2, i * heads * d, heads * d).view({b, s, heads, d}).transpose(1, 2);
  };
  torch::Tensor q = part(0).detach().requires_grad_(), k = part(1).detach().requires_grad_(),
                v = part(2).detach().requires_grad_();
  torch::Tensor seed = torch::randn({b, s, heads, d}).transpose(1, 2);  // as o_proj gives it
  const double forward_flops = 4.0 * b * heads * d * s * (s + 1) / 2;
  std::printf("attention core: batch %lld, %lld heads of %lld, seq %lld, fp32, %d thread(s)\n",
              (long long)b, (long long)heads, (long long)d, (long long)s, threads);
  std::printf("| form | forward ms | forward GFLOP/s | fwd+bwd ms | fwd+bwd GFLOP/s |\n");
  std::printf("|---|---|---|---|---|\n");
  auto report = [&](const char* name, const std::function<torch::Tensor()>& run) {
    const double fwd = seconds(
        [&] {
          torch::NoGradGuard no_grad;
          run();
        },
        3);
    const double both = seconds(
        [&] {
          q.mutable_grad().reset();
          k.mutable_grad().reset();
          v.mutable_grad().reset();
          run().backward(seed);
        },
        3);
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", name, fwd * 1e3, forward_flops / fwd / 1e9,
                both * 1e3, 3 * forward_flops / both / 1e9);
  };
  for (int64_t rows : {64, 128, 256})
    for (int64_t tile : {128, 256, 512, 1024}) {
      char name[64];
      std::snprintf(name, sizeof name, "blocked rows %lld, key tile %lld", (long long)rows,
                    (long long)tile);
      report(name, [&] { return layers::blocked_attention(q, k, v, 0, rows, tile); });
    }
  // The default tiling with its products through kernels/tile_gemm.h and through the BLAS,
  // and ATen's fused attention, alternated 8 times (this machine's speed drifts), medians and
  // bests of fwd+bwd.
  const char* const way_names[3] = {"blocked rows 128, key tile 512, products by tile_gemm",
                                    "blocked rows 128, key tile 512, products through the BLAS",
                                    "ATen scaled_dot_product_attention, causal"};
  std::vector<double> rates[3];
  for (int round = 0; round < 8; ++round)
    for (int way = 0; way < 3; ++way) {
      kernels::set_tile_gemm_enabled(way != 1);
      const double both = seconds(
          [&] {
            q.mutable_grad().reset();
            k.mutable_grad().reset();
            v.mutable_grad().reset();
            torch::Tensor out =
                way == 2 ? at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true)
                         : layers::blocked_attention(q, k, v, 0, 128, 512);
            out.backward(seed);
          },
          3);
      rates[way].push_back(3 * forward_flops / both / 1e9);
    }
  kernels::set_tile_gemm_enabled(true);
  for (int way = 0; way < 3; ++way) {
    std::sort(rates[way].begin(), rates[way].end());
    std::printf("| %s (8 alternating rounds) | - | - | median | %.1f (best %.1f) |\n",
                way_names[way], rates[way][rates[way].size() / 2], rates[way].back());
  }
  report("ATen scaled_dot_product_attention, causal",
         [&] { return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true); });
  report("dense (s x s scores)", [&] {
    return layers::grouped_attention(q, k, v, layers::attention_mask(s, s, 0, 0, q.options()));
  });
  return 0;
}
