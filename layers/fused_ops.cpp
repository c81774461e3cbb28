// layers/fused_ops.cpp: see fused_ops.h.
#include "layers/fused_ops.h"

#include <ATen/Parallel.h>

#include "layers/cpu_kernels.h"
#include "layers/functional.h"

namespace retort::layers {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool loop_ready(const torch::Tensor& t) {
  return t.device().is_cpu() && t.is_contiguous() &&
         (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble);
}

bool loops_apply(std::initializer_list<torch::Tensor> tensors) {
  const auto dtype = tensors.begin()->scalar_type();
  for (const torch::Tensor& t : tensors)
    if (!loop_ready(t) || t.scalar_type() != dtype) return false;
  return true;
}

// Runs body(begin, end) over [0, count) in chunks of at least `grain` elements on torch's
// intra-op threads.
template <typename Body>
void parallel_rows(int64_t count, int64_t grain, const Body& body) {
  at::parallel_for(0, count, grain, body);
}

struct RmsNorm : torch::autograd::Function<RmsNorm> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               double eps) {
    const int64_t n = x.size(-1), rows = x.numel() / n;
    torch::Tensor y = torch::empty_like(x);
    torch::Tensor inv = torch::empty({rows}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_rms_norm", [&] {
      const scalar_t *xp = x.data_ptr<scalar_t>(), *wp = weight.data_ptr<scalar_t>();
      scalar_t *yp = y.data_ptr<scalar_t>(), *ip = inv.data_ptr<scalar_t>();
      parallel_rows(rows, 16, [&](int64_t b, int64_t e) {
        kernels::rms_norm_forward(xp + b * n, wp, yp + b * n, ip + b, e - b, n, eps);
      });
    });
    ctx->save_for_backward({x, weight, inv});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &inv = saved[2];
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t n = x.size(-1), rows = x.numel() / n;
    // The weight's gradient sums over rows: one partial per fixed chunk of rows, added in
    // chunk order, so the result does not depend on which thread ran which chunk.
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
    const int64_t per_chunk = (rows + chunks - 1) / chunks;
    torch::Tensor dx = torch::empty_like(x);
    torch::Tensor partials = torch::zeros({chunks, n}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_rms_norm_backward", [&] {
      const scalar_t *dyp = dy.data_ptr<scalar_t>(), *xp = x.data_ptr<scalar_t>();
      const scalar_t *wp = weight.data_ptr<scalar_t>(), *ip = inv.data_ptr<scalar_t>();
      scalar_t *dxp = dx.data_ptr<scalar_t>(), *pp = partials.data_ptr<scalar_t>();
      at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
        for (int64_t c = cb; c < ce; ++c) {
          const int64_t b = c * per_chunk, e = std::min(rows, b + per_chunk);
          if (b < e)
            kernels::rms_norm_backward(dyp + b * n, xp + b * n, wp, ip + b, dxp + b * n, pp + c * n,
                                       e - b, n);
        }
      });
    });
    torch::Tensor dw = partials[0];
    for (int64_t c = 1; c < chunks; ++c) dw = dw + partials[c];
    return {dx, dw, torch::Tensor()};
  }
};

struct SwiGlu : torch::autograd::Function<SwiGlu> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor gate, torch::Tensor up) {
    torch::Tensor out = torch::empty_like(gate);
    AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "fused_swiglu", [&] {
      const scalar_t *gp = gate.data_ptr<scalar_t>(), *up_p = up.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      parallel_rows(gate.numel(), 4096, [&](int64_t b, int64_t e) {
        kernels::swiglu_forward(gp + b, up_p + b, op + b, e - b);
      });
    });
    ctx->save_for_backward({gate, up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &gate = saved[0], &up = saved[1];
    const torch::Tensor dy = grads[0].contiguous();
    torch::Tensor d_gate = torch::empty_like(gate), d_up = torch::empty_like(up);
    AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "fused_swiglu_backward", [&] {
      const scalar_t *dyp = dy.data_ptr<scalar_t>(), *gp = gate.data_ptr<scalar_t>();
      const scalar_t* up_p = up.data_ptr<scalar_t>();
      scalar_t *dgp = d_gate.data_ptr<scalar_t>(), *dup = d_up.data_ptr<scalar_t>();
      parallel_rows(gate.numel(), 4096, [&](int64_t b, int64_t e) {
        kernels::swiglu_backward(dyp + b, gp + b, up_p + b, dgp + b, dup + b, e - b);
      });
    });
    return {d_gate, d_up};
  }
};

// Rotates t [batch * seq rows of heads x d] in place.
void rotate_in_place(torch::Tensor& t, const torch::Tensor& cos, const torch::Tensor& sin,
                     int64_t seq_len, bool inverse) {
  const int64_t d = cos.size(-1), rows = t.size(0) * t.size(1);
  const int64_t heads = t.numel() / (rows * d);
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "fused_rope", [&] {
    scalar_t* xp = t.data_ptr<scalar_t>();
    const scalar_t *cp = cos.data_ptr<scalar_t>(), *sp = sin.data_ptr<scalar_t>();
    parallel_rows(rows, 8, [&](int64_t b, int64_t e) {
      kernels::rope_rotate(xp, cp, sp, b, e, seq_len, heads, d, inverse);
    });
  });
}

struct RopeInPlace : torch::autograd::Function<RopeInPlace> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor cos,
                               torch::Tensor sin) {
    rotate_in_place(x, cos, sin, x.size(1), /*inverse=*/false);
    ctx->mark_dirty({x});
    ctx->save_for_backward({cos, sin});
    return x;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    // The rotation is orthogonal: its backward rotates the gradient by minus the angle.
    torch::Tensor dx = grads[0].contiguous().clone();
    rotate_in_place(dx, saved[0], saved[1], dx.size(1), /*inverse=*/true);
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (!loops_apply({x, weight}) || weight.dim() != 1 || weight.size(0) != x.size(-1))
    return rms_norm(x, weight, eps);
  return RmsNorm::apply(x, weight, eps);
}

torch::Tensor fused_swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  if (!loops_apply({gate, up}) || gate.sizes() != up.sizes()) return torch::silu(gate) * up;
  return SwiGlu::apply(gate, up);
}

torch::Tensor fused_rope_(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t b = x.size(0), s = x.size(1), d = cos.size(-1);
  if (!loops_apply({x, cos, sin}) || cos.size(0) != s || (x.is_leaf() && x.requires_grad())) {
    torch::Tensor per_head = x.reshape({b, s, -1, d}).transpose(1, 2);
    return apply_rope(per_head, cos, sin).transpose(1, 2).reshape(x.sizes());
  }
  return RopeInPlace::apply(x, cos, sin);
}

}  // namespace retort::layers
