// layers/fused_ops.cpp: see fused_ops.h.
#include "layers/fused_ops.h"

#include <ATen/Parallel.h>

#include "kernels/row_loops.h"
#include "layers/accumulation_type.h"
#include "layers/functional.h"
#include "layers/kernel_route.h"
#include "parallel/background_progress.h"

namespace retort::layers {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool loop_ready(const torch::Tensor& t) {
  return t.device().is_cpu() && t.is_contiguous() &&
         (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble ||
          t.scalar_type() == torch::kBFloat16);
}

bool loops_apply(std::initializer_list<torch::Tensor> tensors) {
  const auto dtype = tensors.begin()->scalar_type();
  for (const torch::Tensor& t : tensors)
    if (!loop_ready(t) || t.scalar_type() != dtype) return false;
  return true;
}

kernels::Bf16* bf16_data(const torch::Tensor& t) {
  return reinterpret_cast<kernels::Bf16*>(t.data_ptr<at::BFloat16>());
}

bool is_bf16(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16;
}

// Runs body(begin, end) over [0, count) in chunks of at least `grain` elements on torch's
// intra-op threads.
template <typename Body>
void parallel_rows(int64_t count, int64_t grain, const Body& body) {
  at::parallel_for(0, count, grain, body);
}

// y = rms_norm(x) * weight in `out`'s type: x and weight float or double alike (y the same), or
// bf16 rows computed in float32: x bf16 (y bf16) or x float32 (y bf16), weight float32.
struct RmsNorm : torch::autograd::Function<RmsNorm> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               double eps, torch::ScalarType out) {
    const int64_t n = x.size(-1), rows = x.numel() / n;
    torch::Tensor y = torch::empty(x.sizes(), x.options().dtype(out));
    torch::Tensor inv = torch::empty({rows}, weight.options());
    const float* wf = weight.scalar_type() == torch::kFloat ? weight.data_ptr<float>() : nullptr;
    if (is_bf16(x)) {
      const kernels::Bf16* xp = bf16_data(x);
      kernels::Bf16* yp = bf16_data(y);
      float* ip = inv.data_ptr<float>();
      parallel_rows(rows, 16, [&](int64_t b, int64_t e) {
        kernels::rms_norm_forward(xp + b * n, wf, yp + b * n, ip + b, e - b, n, eps);
      });
    } else if (is_bf16(y)) {
      const float* xp = x.data_ptr<float>();
      kernels::Bf16* yp = bf16_data(y);
      float* ip = inv.data_ptr<float>();
      parallel_rows(rows, 16, [&](int64_t b, int64_t e) {
        kernels::rms_norm_forward(xp + b * n, wf, yp + b * n, ip + b, e - b, n, eps);
      });
    } else {
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_rms_norm", [&] {
        const scalar_t *xp = x.data_ptr<scalar_t>(), *wp = weight.data_ptr<scalar_t>();
        scalar_t *yp = y.data_ptr<scalar_t>(), *ip = inv.data_ptr<scalar_t>();
        parallel_rows(rows, 16, [&](int64_t b, int64_t e) {
          kernels::rms_norm_forward(xp + b * n, wp, yp + b * n, ip + b, e - b, n, eps);
        });
      });
    }
    ctx->save_for_backward({x, weight, inv});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    parallel::drive_background_progress();  // communication in flight moves on
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &inv = saved[2];
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t n = x.size(-1), rows = x.numel() / n;
    // The weight's gradient sums over rows: one partial per fixed chunk of rows, added in
    // chunk order, so the result does not depend on which thread ran which chunk.
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
    const int64_t per_chunk = (rows + chunks - 1) / chunks;
    torch::Tensor dx = torch::empty_like(x);
    torch::Tensor partials = torch::zeros({chunks, n}, weight.options());
    // Each chunk of rows: run(first row, rows, its partial).
    auto over_chunks = [&](const auto& run) {
      at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
        for (int64_t c = cb; c < ce; ++c) {
          const int64_t b = c * per_chunk, e = std::min(rows, b + per_chunk);
          if (b < e) run(b, e - b, c);
        }
      });
    };
    if (is_bf16(dy)) {
      const kernels::Bf16* dyp = bf16_data(dy);
      const float *wp = weight.data_ptr<float>(), *ip = inv.data_ptr<float>();
      float* pp = partials.data_ptr<float>();
      if (is_bf16(x)) {
        const kernels::Bf16* xp = bf16_data(x);
        kernels::Bf16* dxp = bf16_data(dx);
        over_chunks([&](int64_t b, int64_t count, int64_t c) {
          kernels::rms_norm_backward(dyp + b * n, xp + b * n, wp, ip + b, dxp + b * n, pp + c * n,
                                     count, n);
        });
      } else {
        const float* xp = x.data_ptr<float>();
        float* dxp = dx.data_ptr<float>();
        over_chunks([&](int64_t b, int64_t count, int64_t c) {
          kernels::rms_norm_backward(dyp + b * n, xp + b * n, wp, ip + b, dxp + b * n, pp + c * n,
                                     count, n);
        });
      }
    } else {
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_rms_norm_backward", [&] {
        const scalar_t *dyp = dy.data_ptr<scalar_t>(), *xp = x.data_ptr<scalar_t>();
        const scalar_t *wp = weight.data_ptr<scalar_t>(), *ip = inv.data_ptr<scalar_t>();
        scalar_t *dxp = dx.data_ptr<scalar_t>(), *pp = partials.data_ptr<scalar_t>();
        over_chunks([&](int64_t b, int64_t count, int64_t c) {
          kernels::rms_norm_backward(dyp + b * n, xp + b * n, wp, ip + b, dxp + b * n, pp + c * n,
                                     count, n);
        });
      });
    }
    torch::Tensor dw = partials[0];
    for (int64_t c = 1; c < chunks; ++c) dw = dw + partials[c];
    return {dx, dw, torch::Tensor(), torch::Tensor()};
  }
};

struct SwiGluPacked : torch::autograd::Function<SwiGluPacked> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor gate_up) {
    const int64_t n = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * n);
    std::vector<int64_t> sizes = gate_up.sizes().vec();
    sizes.back() = n;
    torch::Tensor out = torch::empty(sizes, gate_up.options());
    const int64_t grain = std::max<int64_t>(1, 4096 / n);
    if (is_bf16(gate_up)) {
      const kernels::Bf16* gp = bf16_data(gate_up);
      kernels::Bf16* op = bf16_data(out);
      parallel_rows(rows, grain, [&](int64_t b, int64_t e) {
        kernels::swiglu_forward(gp + b * 2 * n, op + b * n, e - b, n);
      });
    } else {
      AT_DISPATCH_FLOATING_TYPES(gate_up.scalar_type(), "fused_swiglu", [&] {
        const scalar_t* gp = gate_up.data_ptr<scalar_t>();
        scalar_t* op = out.data_ptr<scalar_t>();
        parallel_rows(rows, grain, [&](int64_t b, int64_t e) {
          kernels::swiglu_forward(gp + b * 2 * n, op + b * n, e - b, n);
        });
      });
    }
    ctx->save_for_backward({gate_up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    parallel::drive_background_progress();  // communication in flight moves on
    const torch::Tensor gate_up = ctx->get_saved_variables()[0];
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t n = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * n);
    torch::Tensor d_gate_up = torch::empty_like(gate_up);
    const int64_t grain = std::max<int64_t>(1, 4096 / n);
    if (is_bf16(gate_up)) {
      const kernels::Bf16 *dyp = bf16_data(dy), *gp = bf16_data(gate_up);
      kernels::Bf16* dp = bf16_data(d_gate_up);
      parallel_rows(rows, grain, [&](int64_t b, int64_t e) {
        kernels::swiglu_backward(dyp + b * n, gp + b * 2 * n, dp + b * 2 * n, e - b, n);
      });
    } else {
      AT_DISPATCH_FLOATING_TYPES(gate_up.scalar_type(), "fused_swiglu_backward", [&] {
        const scalar_t *dyp = dy.data_ptr<scalar_t>(), *gp = gate_up.data_ptr<scalar_t>();
        scalar_t* dp = d_gate_up.data_ptr<scalar_t>();
        parallel_rows(rows, grain, [&](int64_t b, int64_t e) {
          kernels::swiglu_backward(dyp + b * n, gp + b * 2 * n, dp + b * 2 * n, e - b, n);
        });
      });
    }
    return {d_gate_up};
  }
};

// Rotates the first `heads` heads of each [batch * seq] row of t in place.
void rotate_in_place(torch::Tensor& t, const torch::Tensor& cos, const torch::Tensor& sin,
                     int64_t heads, bool inverse) {
  const int64_t d = cos.size(-1), seq_len = t.size(1), rows = t.size(0) * t.size(1);
  const int64_t row_stride = t.numel() / rows;
  if (is_bf16(t)) {  // float32 tables
    kernels::Bf16* xp = bf16_data(t);
    const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
    parallel_rows(rows, 8, [&](int64_t b, int64_t e) {
      kernels::rope_rotate(xp, cp, sp, b, e, row_stride, seq_len, heads, d, inverse);
    });
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "fused_rope", [&] {
    scalar_t* xp = t.data_ptr<scalar_t>();
    const scalar_t *cp = cos.data_ptr<scalar_t>(), *sp = sin.data_ptr<scalar_t>();
    parallel_rows(rows, 8, [&](int64_t b, int64_t e) {
      kernels::rope_rotate(xp, cp, sp, b, e, row_stride, seq_len, heads, d, inverse);
    });
  });
}

struct RopeInPlace : torch::autograd::Function<RopeInPlace> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor cos,
                               torch::Tensor sin, int64_t heads) {
    rotate_in_place(x, cos, sin, heads, /*inverse=*/false);
    ctx->mark_dirty({x});
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["heads"] = heads;
    return x;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    parallel::drive_background_progress();  // communication in flight moves on
    const auto saved = ctx->get_saved_variables();
    // The rotation is orthogonal: its backward rotates the gradient by minus the angle (the
    // heads left alone pass their gradient through).
    torch::Tensor dx = grads[0].contiguous().clone();
    rotate_in_place(dx, saved[0], saved[1], ctx->saved_data["heads"].toInt(), /*inverse=*/true);
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                             std::optional<torch::ScalarType> out_type) {
  const torch::ScalarType out = out_type.value_or(x.scalar_type());
  const bool shapes = weight.dim() == 1 && weight.size(0) == x.size(-1);
  // Alike (float or double throughout), or bf16 rows with a float32 weight.
  const bool alike = loops_apply({x, weight}) && out == x.scalar_type() && !is_bf16(x);
  const bool bf16_rows = loop_ready(x) && loop_ready(weight) && out == torch::kBFloat16 &&
                         weight.scalar_type() == torch::kFloat &&
                         (is_bf16(x) || x.scalar_type() == torch::kFloat);
  if (!shapes || !(alike || bf16_rows)) return rms_norm(x, weight, eps).to(out);
  return RmsNorm::apply(x, weight, eps, out);
}

torch::Tensor fused_swiglu_packed(const torch::Tensor& gate_up) {
  const int64_t n = gate_up.size(-1) / 2;
  if (!loops_apply({gate_up}) || gate_up.size(-1) % 2 != 0)
    return torch::silu(gate_up.narrow(-1, 0, n)) * gate_up.narrow(-1, n, n);
  return SwiGluPacked::apply(gate_up);
}

torch::Tensor fused_rope_(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rotated_heads) {
  const int64_t b = x.size(0), s = x.size(1), d = cos.size(-1);
  const int64_t heads = x.numel() / (b * s * d);
  const int64_t rotated = rotated_heads < 0 ? heads : rotated_heads;
  const bool tables_fit = is_bf16(x) ? loops_apply({cos, sin}) && cos.scalar_type() == torch::kFloat
                                     : loops_apply({x, cos, sin});
  if (!loop_ready(x) || !tables_fit || cos.size(0) != s || (x.is_leaf() && x.requires_grad())) {
    torch::Tensor per_head = x.reshape({b, s, heads, d});
    torch::Tensor turned =
        apply_rope(per_head.narrow(2, 0, rotated).transpose(1, 2), cos, sin).transpose(1, 2);
    if (rotated < heads)
      turned = torch::cat({turned, per_head.narrow(2, rotated, heads - rotated)}, 2);
    return turned.reshape(x.sizes());
  }
  return RopeInPlace::apply(x, cos, sin, rotated);
}

torch::Tensor stream_rms_norm(const KernelPolicy& policy, const torch::Tensor& x,
                              const torch::Tensor& weight, std::optional<torch::ScalarType> compute,
                              double eps) {
  const torch::ScalarType out = compute.value_or(x.scalar_type());
  // The weight at its value in the output's type, held in that type's accumulation type (the
  // loops read a float32 weight for bf16 rows); no-ops where the types agree.
  const torch::Tensor w = weight.to(out).to(accumulation_type(out));
  // On a GPU, ATen's fused operator: one kernel each way, normalised and scaled in float32,
  // rounded once (the composition below rounds the normalised rows before the scale).
  if (x.is_cuda()) return at::rms_norm(x, {x.size(-1)}, w.to(x.scalar_type()), eps).to(out);
  if (fused_block_parts(policy, x)) return fused_rms_norm(x, w, eps, out);
  return rms_norm(x, w, eps).to(out);
}

}  // namespace retort::layers
