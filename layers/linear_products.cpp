// layers/linear_products.cpp: see linear_products.h.
#include "layers/linear_products.h"

#include <vector>

#include "common/saved_object.h"
#include "kernels/tile_gemm.h"
#include "layers/compute_copy.h"
#include "layers/grad_destinations.h"
#include "layers/kernel_route.h"
#include "layers/widened_products.h"
#include "parallel/background_progress.h"

namespace retort::layers {
namespace {

namespace kernels = retort::kernels;

// The tile loops take the product when the dispatch routes its device, dtype and shape to
// them (kernels/dispatch.h), both operands are alike, A's rows are contiguous, and no autograd
// graph is being recorded through them (they work on raw memory: LinearProduct records it
// instead).
bool use_tile(kernels::KernelMode mode, const torch::Tensor& a2d, const torch::Tensor& w) {
  const bool recording =
      torch::GradMode::is_enabled() && (a2d.requires_grad() || w.requires_grad());
  return !recording && w.scalar_type() == a2d.scalar_type() && w.device() == a2d.device() &&
         a2d.is_contiguous() && w.dim() == 2 &&
         runs_our_loops(mode, kernels::Operation::linear_product, a2d, a2d.size(0), a2d.size(1));
}

// C [m, n] = A [m, k] B, A contiguous, B element (p, c) at b[p * b_row + c * b_col]. The
// output's 32-column panels are split over the threads; each thread packs one panel of B at a
// time into a buffer of its own (32 k floats, 64-192 KB here: it stays in L2) and runs the
// tile loops on it, so no packed copy of B outlives the call.
// The output is allocated in its final shape `sizes` ([..., n]), not viewed into it: a custom
// autograd function must not return a view of a tensor it made.
torch::Tensor tile_product(const torch::Tensor& a, const float* b, int64_t b_row, int64_t b_col,
                           int64_t n, at::IntArrayRef sizes) {
  const int64_t m = a.size(0), k = a.size(1);
  torch::Tensor c = torch::empty(sizes, a.options());
  const float* ap = a.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  const int64_t panels = (n + kernels::kPanelColumns - 1) / kernels::kPanelColumns;
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
    thread_local std::vector<float> panel;
    panel.resize(size_t(kernels::kPanelColumns * k));
    for (int64_t j = first; j < last; ++j) {
      const int64_t c0 = j * kernels::kPanelColumns;
      const int64_t width = std::min(kernels::kPanelColumns, n - c0);
      const kernels::Panels packed =
          kernels::pack_panels(b + c0 * b_col, b_row, b_col, k, width, panel.data());
      kernels::tile_gemm(m, width, k, 1.0f, ap, k, 1, packed, false, cp + c0, n);
    }
  });
  return c;
}

// The leading dimensions of x with `last` as the last one.
std::vector<int64_t> with_last(const torch::Tensor& x, int64_t last) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = last;
  return sizes;
}

}  // namespace

void product_into(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  // A 16-bit product into a wider gradient: rounded once (the CPU has no mixed-type product),
  // or widened to float32 where bf16 products are (layers/widened_products.h).
  mm_out_widening(out, a, b);
}

// bench_products' rows against MKL (the header says where): ahead or level from 64 to 256
// rows where A is at most 256 x 1536; behind at 1024 rows. Fewer than 64 rows were not
// measured and stay with the BLAS.
torch::Tensor product_by_transposed(const torch::Tensor& x, const torch::Tensor& weight,
                                    RunContext* run) {
  const torch::Tensor w = weight_in(copies_of(run), weight, x.scalar_type());
  const torch::Tensor x2d = x.reshape({-1, x.size(-1)});
  if (!use_tile(mode_of(run), x2d, w)) return matmul_widening(x, w.t());
  // B = W^T: element (p, c) is W[c][p].
  const torch::Tensor w_data = w.detach();
  return tile_product(x2d.detach(), w_data.data_ptr<float>(), w_data.stride(1), w_data.stride(0),
                      w.size(0), with_last(x, w.size(0)));
}

torch::Tensor product_by(const torch::Tensor& dy, const torch::Tensor& weight, RunContext* run) {
  const torch::Tensor w = weight_in(copies_of(run), weight, dy.scalar_type());
  // Nothing to add up (a TP rank whose vocabulary slice is all padding: dy [..., 0]): ATen's
  // product gives the zeros, where the rows could not even be flattened.
  if (dy.size(-1) == 0) return matmul_widening(dy, w);
  const torch::Tensor dy2d = dy.reshape({-1, dy.size(-1)});
  if (!use_tile(mode_of(run), dy2d, w)) return matmul_widening(dy, w);
  const torch::Tensor w_data = w.detach();
  return tile_product(dy2d.detach(), w_data.data_ptr<float>(), w_data.stride(0), w_data.stride(1),
                      w.size(1), with_last(dy, w.size(1)));
}

void product_by_out(torch::Tensor& out, const torch::Tensor& dy, const torch::Tensor& weight,
                    RunContext* run) {
  const torch::Tensor w = weight_in(copies_of(run), weight, dy.scalar_type());
  if (out.is_contiguous() && out.dim() == 2 && dy.dim() == 2 && use_tile(mode_of(run), dy, w))
    out.copy_(product_by(dy, w, run));
  else
    mm_out_widening(out, dy, w);
}

torch::Tensor LinearProduct::forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                     const torch::Tensor& w, RunContext* run) {
  // The weight as the product used it (its compute copy under mixed precision, when copies
  // are kept), for dx, and the weight itself, whose gradient is wanted.
  const torch::Tensor used = weight_in(copies_of(run), w, x.scalar_type());
  const bool save_copy =
      used.scalar_type() == w.scalar_type() || compute_copies_kept(copies_of(run));
  ctx->save_for_backward({x, w, save_copy ? used : torch::Tensor()});
  save_object(ctx, "run", run);
  return product_by_transposed(x, used, run);
}

torch::autograd::variable_list LinearProduct::backward(torch::autograd::AutogradContext* ctx,
                                                       torch::autograd::variable_list grads) {
  const torch::autograd::variable_list saved = ctx->get_saved_variables();
  const torch::Tensor &x = saved[0], &w = saved[1];
  const torch::Tensor& dy = grads[0];
  torch::Tensor dx, dw;
  // A copy not kept is cast again (w is unchanged since forward: autograd checks its version).
  RunContext* run = saved_object<RunContext*>(ctx, "run");
  if (ctx->needs_input_grad(0))
    dx = product_by(
        dy, saved[2].defined() ? saved[2] : weight_in(copies_of(run), w, x.scalar_type()), run);
  parallel::drive_background_progress();  // between the two products
  if (ctx->needs_input_grad(1)) {
    const torch::Tensor dy_t = dy.reshape({-1, dy.size(-1)}).t(), x2d = x.reshape({-1, x.size(-1)});
    dw = take_grad_destination(gradients_of(run), w);  // where the gradient is wanted, if offered
    if (dw.defined())
      product_into(dw, dy_t, x2d);
    else
      dw = matmul_widening(dy_t, x2d);  // in the activations' type; autograd casts it to w's
  }
  return {dx, dw, torch::Tensor()};
}

}  // namespace retort::layers
