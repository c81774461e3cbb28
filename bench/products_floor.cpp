// bench/products_floor.cpp: see products_floor.h.
#include "products_floor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace retort::bench {
namespace {

// One linear product of the step: input x [m, k], weight w [n, k], with the forward output,
// the incoming gradient, the input gradient and the weight gradient allocated once.
struct Product {
  torch::Tensor x, w, y, dy, dx, dw;
  Product(int64_t m, int64_t k, int64_t n)
      : x(torch::randn({m, k})),
        w(torch::randn({n, k})),
        y(torch::empty({m, n})),
        dy(torch::randn({m, n})),
        dx(torch::empty({m, k})),
        dw(torch::zeros({n, k})) {}
  double flops() const { return 6.0 * double(x.size(0)) * double(x.size(1)) * double(w.size(0)); }
};

}  // namespace

ProductsFloor measure_products_floor(const layers::ModelConfig& model, int64_t tokens,
                                     int64_t head_chunk_tokens, int64_t micro_batches,
                                     int repeats) {
  torch::NoGradGuard no_grad;
  const int64_t h = model.hidden, d = model.head_dim(), f = model.ffn_hidden;
  std::vector<Product> products;
  for (int64_t layer = 0; layer < model.layers; ++layer) {
    products.emplace_back(tokens, h, (model.heads + 2 * model.kv_heads) * d);
    products.emplace_back(tokens, model.heads * d, h);
    products.emplace_back(tokens, h, 2 * f);
    products.emplace_back(tokens, f, h);
  }
  const int64_t chunk = head_chunk_tokens > 0 ? head_chunk_tokens : tokens;
  for (int64_t start = 0; start < tokens; start += chunk)
    products.emplace_back(std::min(chunk, tokens - start), h, model.vocab_size);

  auto step = [&] {
    for (int64_t micro = 0; micro < micro_batches; ++micro) {
      for (Product& p : products) torch::mm_out(p.y, p.x, p.w.t());
      for (auto p = products.rbegin(); p != products.rend(); ++p) {
        torch::mm_out(p->dx, p->dy, p->w);
        p->dw.addmm_(p->dy.t(), p->x);
      }
    }
  };
  ProductsFloor floor;
  for (const Product& p : products) floor.gflop += double(micro_batches) * p.flops() / 1e9;
  step();
  floor.seconds = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    step();
    floor.seconds =
        std::min(floor.seconds,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return floor;
}

}  // namespace retort::bench
