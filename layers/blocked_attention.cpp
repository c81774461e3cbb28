// layers/blocked_attention.cpp: see blocked_attention.h.
#include "layers/blocked_attention.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "common/trace_span.h"
#include "kernels/attention_kernels.h"
#include "layers/functional.h"
#include "layers/kernel_route.h"
#include "layers/widened_products.h"
#include "parallel/background_progress.h"

namespace retort::layers {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The sizes every block loop needs.
struct Shape {
  int64_t b, kv_heads, group, s, d, window, block_rows, key_block;
  double scale;
};

Shape shape_of(const torch::Tensor& q, const torch::Tensor& k, int64_t window, int64_t block_rows,
               int64_t key_block) {
  const int64_t d = q.size(3);
  return {q.size(0),  k.size(1), q.size(1) / k.size(1),     q.size(2), d, window,
          block_rows, key_block, 1.0 / std::sqrt(double(d))};
}

// One block of keys [begin, begin + size) met by the query block [q0, q0 + rows).
struct KeyBlock {
  int64_t begin, size;
  bool needs_mask;
};

// The key blocks query rows q0 .. q0+rows-1 can see: keys up to the last row (causal), and
// from the first row's window start.
std::vector<KeyBlock> key_blocks(const Shape& sh, int64_t q0, int64_t rows) {
  const int64_t last = q0 + rows - 1;
  const int64_t lo = sh.window > 0 ? std::max<int64_t>(0, q0 - sh.window + 1) : 0;
  std::vector<KeyBlock> blocks;
  for (int64_t k0 = lo; k0 <= last; k0 += sh.key_block) {
    const int64_t size = std::min(sh.key_block, last + 1 - k0);
    const bool above_diagonal = k0 + size - 1 > q0;
    const bool outside_window = sh.window > 0 && last - k0 >= sh.window;
    blocks.push_back({k0, size, above_diagonal || outside_window});
  }
  return blocks;
}

// Scaled scores [b, kv_heads, group * rows, keys] of one (query block, key block) pair, with
// -inf where a key is invisible.
// k_t is k transposed to [b, kv_heads, d, s] and contiguous: OpenBLAS multiplies by it about
// twice as fast as by a transposed view of k (inner dimension d = 64 here).
torch::Tensor block_scores(const Shape& sh, const torch::Tensor& q_block, const torch::Tensor& k_t,
                           int64_t q0, int64_t rows, const KeyBlock& kb) {
  torch::Tensor scores = matmul_widening(q_block, k_t.narrow(3, kb.begin, kb.size));
  if (kb.needs_mask) {
    torch::Tensor mask = attention_mask(rows, kb.size, q0 - kb.begin, sh.window, scores.options());
    scores.view({sh.b, sh.kv_heads, sh.group, rows, kb.size}).add_(mask);
  }
  return scores;
}

// Rows q0 .. q0+rows-1 of t [b, kv_heads, group, s, ...] as [b, kv_heads, group * rows, ...].
torch::Tensor rows_of(const torch::Tensor& t, const Shape& sh, int64_t q0, int64_t rows) {
  std::vector<int64_t> sizes{sh.b, sh.kv_heads, sh.group * rows};
  if (t.dim() == 5) sizes.push_back(t.size(4));
  return t.narrow(3, q0, rows).reshape(sizes);
}

// The fused CPU kernels (attention_kernels.h), where the dispatch routes q's device and dtype
// to them under `mode`, with k and v alike.
bool fused_kernels_apply(kernels::KernelMode mode, const torch::Tensor& q, const torch::Tensor& k,
                         const torch::Tensor& v) {
  return runs_our_loops(mode, kernels::Operation::attention, q) &&
         k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
         k.device() == q.device() && v.device() == q.device();
}

kernels::AttentionShape kernel_shape(const Shape& sh) {
  return {sh.s, sh.d, sh.group, sh.window, sh.block_rows, std::min(sh.key_block, sh.s), sh.scale};
}

// t [b, heads, s, d] with rows of d contiguous values (copied only if not).
torch::Tensor unit_rows(const torch::Tensor& t) {
  return t.stride(3) == 1 ? t : t.contiguous();
}

template <typename T>
kernels::HeadRows<T> head_rows(const torch::Tensor& t) {
  return {t.data_ptr<std::remove_const_t<T>>(), t.stride(0), t.stride(1), t.stride(2)};
}

// task(i, workspace) for i in [0, n) on torch's threads, each with a workspace of its own (a
// tensor, so the memory accounting sees it). The BLAS's products run on the calling thread:
// MKL, called inside an OpenMP parallel region, runs single-threaded. The items are handed
// out one at a time in index order, not in fixed shares: the two cores of a cloud machine
// often run at speeds 5-15% apart, and with a fixed share of heads the faster thread waited
// for the slower at the end of each call.
template <typename T, typename Task>
void run_items(int64_t n, int64_t workspace_elements, const torch::TensorOptions& options,
               const Task& task) {
  const int threads = at::get_num_threads();
  torch::Tensor workspace = torch::empty({threads, workspace_elements}, options);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    T* mine = workspace.data_ptr<T>() + at::get_thread_num() * workspace_elements;
    for (int64_t i = next++; i < n; i = next++) task(i, mine);
  });
}

// The items' shared state (kernels::attention_*_state elements per unit) and their query
// blocks' counters, zeroed (attention_kernels.h).
struct ItemState {
  torch::Tensor state, done;
};
ItemState item_state(int64_t units, int64_t state_elements, int64_t blocks_per_unit,
                     const torch::TensorOptions& options) {
  return {torch::empty({units, state_elements}, options),
          torch::zeros({units, blocks_per_unit}, options.dtype(torch::kInt))};
}

// Output [b, heads, s, d] (laid out [b, s, heads, d]) and log-sum-exp [b, heads, s].
std::pair<torch::Tensor, torch::Tensor> fused_forward(const Shape& sh, const torch::Tensor& q,
                                                      const torch::Tensor& k,
                                                      const torch::Tensor& v) {
  TraceSpan span([] { return "retort attention forward"; });
  const int64_t heads = sh.kv_heads * sh.group, units = sh.b * heads;
  const kernels::AttentionShape ks = kernel_shape(sh);
  torch::Tensor qr = unit_rows(q), kr = unit_rows(k), vr = unit_rows(v);
  torch::Tensor out = torch::empty({sh.b, sh.s, heads, sh.d}, q.options()).transpose(1, 2);
  torch::Tensor lse = torch::empty({sh.b, heads, sh.s}, q.options());
  const int64_t state_elements = kernels::attention_forward_state(ks);
  const int64_t blocks = kernels::attention_query_blocks(ks);
  ItemState items = item_state(units, state_elements, blocks, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_attention_forward", [&] {
    scalar_t* lse_data = lse.data_ptr<scalar_t>();
    scalar_t* state = items.state.data_ptr<scalar_t>();
    int32_t* done = items.done.data_ptr<int32_t>();
    run_items<scalar_t>(kernels::attention_key_tiles(ks) * units, kernels::attention_workspace(ks),
                        q.options(), [&](int64_t i, scalar_t* workspace) {
                          const int64_t unit = i % units;  // batch * heads + head
                          kernels::attention_forward_tile(
                              ks, head_rows<const scalar_t>(qr), head_rows<const scalar_t>(kr),
                              head_rows<const scalar_t>(vr), head_rows<scalar_t>(out),
                              lse_data + unit * sh.s, unit / heads, unit % heads, i / units,
                              state + unit * state_elements, done + unit * blocks, workspace);
                        });
  });
  return {out, lse};
}

// dq, dk, dv ([b, heads or kv_heads, s, d], laid out [b, s, heads, d]).
variable_list fused_backward(const Shape& sh, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& out,
                             const torch::Tensor& lse, const torch::Tensor& d_out) {
  TraceSpan span([] { return "retort attention backward"; });
  const int64_t heads = sh.kv_heads * sh.group, units = sh.b * sh.kv_heads;
  const kernels::AttentionShape ks = kernel_shape(sh);
  torch::Tensor qr = unit_rows(q), kr = unit_rows(k), vr = unit_rows(v), o = unit_rows(out),
                g = unit_rows(d_out);
  // Every row is written by the kernels (dK and dV by the one item of their key tile).
  auto per_head = [&](int64_t h) {
    return torch::empty({sh.b, sh.s, h, sh.d}, q.options()).transpose(1, 2);
  };
  torch::Tensor dq = per_head(heads), dk = per_head(sh.kv_heads), dv = per_head(sh.kv_heads);
  const int64_t state_elements = kernels::attention_backward_state(ks);
  const int64_t blocks = sh.group * kernels::attention_query_blocks(ks);
  ItemState items = item_state(units, state_elements, blocks, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_attention_backward", [&] {
    const scalar_t* lse_data = lse.data_ptr<scalar_t>();
    scalar_t* state = items.state.data_ptr<scalar_t>();
    int32_t* done = items.done.data_ptr<int32_t>();
    run_items<scalar_t>(kernels::attention_key_tiles(ks) * units, kernels::attention_workspace(ks),
                        q.options(), [&](int64_t i, scalar_t* workspace) {
                          const int64_t unit = i % units;  // batch * kv_heads + kv_head
                          const int64_t batch = unit / sh.kv_heads;
                          kernels::attention_backward_tile(
                              ks, head_rows<const scalar_t>(qr), head_rows<const scalar_t>(kr),
                              head_rows<const scalar_t>(vr), head_rows<const scalar_t>(o),
                              head_rows<const scalar_t>(g), lse_data + batch * heads * sh.s,
                              head_rows<scalar_t>(dq), head_rows<scalar_t>(dk),
                              head_rows<scalar_t>(dv), batch, unit % sh.kv_heads, i / units,
                              state + unit * state_elements, done + unit * blocks, workspace);
                        });
  });
  return {dq, dk, dv};
}

struct BlockedAttention : torch::autograd::Function<BlockedAttention> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k,
                               torch::Tensor v, int64_t window, int64_t block_rows,
                               int64_t key_block, bool fused) {
    const Shape sh = shape_of(q, k, window, block_rows, key_block);
    ctx->saved_data["window"] = window;
    ctx->saved_data["block_rows"] = block_rows;
    ctx->saved_data["key_block"] = key_block;
    ctx->saved_data["fused"] = fused;
    if (fused) {
      auto [out, lse] = fused_forward(sh, q, k, v);
      ctx->save_for_backward({q, k, v, out, lse});
      return out;
    }
    const double neg_inf = -std::numeric_limits<double>::infinity();
    torch::Tensor q5 = q.reshape({sh.b, sh.kv_heads, sh.group, sh.s, sh.d});
    // The output is laid out [b, s, heads, d], what the o projection reads.
    torch::Tensor out = torch::empty({sh.b, sh.s, sh.kv_heads, sh.group, sh.d}, q.options());
    torch::Tensor lse = torch::empty({sh.b, sh.kv_heads, sh.group, sh.s}, q.options());
    torch::Tensor k_t = k.transpose(-1, -2).contiguous();
    for (int64_t q0 = 0; q0 < sh.s; q0 += sh.block_rows) {
      const int64_t rows = std::min(sh.block_rows, sh.s - q0);
      torch::Tensor q_block = rows_of(q5, sh, q0, rows).mul(sh.scale);
      torch::Tensor running_max, running_sum, acc;
      for (const KeyBlock& kb : key_blocks(sh, q0, rows)) {
        torch::Tensor p = block_scores(sh, q_block, k_t, q0, rows, kb);
        torch::Tensor block_max = p.amax(-1, /*keepdim=*/true);
        torch::Tensor new_max =
            running_max.defined() ? torch::maximum(running_max, block_max) : block_max;
        // Rows that have seen no visible key yet keep max -inf; shift them by 0 so exp gives 0.
        torch::Tensor shift = new_max.masked_fill(new_max == neg_inf, 0.0);
        p.sub_(shift).exp_();
        torch::Tensor pv = matmul_widening(p, v.narrow(2, kb.begin, kb.size));
        if (!acc.defined()) {
          running_sum = p.sum(-1, true);
          acc = pv;
        } else {
          torch::Tensor decay = (running_max - shift).exp_();
          running_sum = running_sum.mul_(decay).add_(p.sum(-1, true));
          acc = acc.mul_(decay).add_(pv);
        }
        running_max = new_max;
      }
      acc.div_(running_sum);
      out.narrow(1, q0, rows)
          .copy_(acc.view({sh.b, sh.kv_heads, sh.group, rows, sh.d}).permute({0, 3, 1, 2, 4}));
      lse.narrow(3, q0, rows)
          .copy_((running_max + running_sum.log()).view({sh.b, sh.kv_heads, sh.group, rows}));
    }
    torch::Tensor result = out.view({sh.b, sh.s, sh.kv_heads * sh.group, sh.d}).transpose(1, 2);
    ctx->save_for_backward({q, k, v, result, lse});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    parallel::drive_background_progress();  // communication in flight moves on
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3],
                        &lse = saved[4];
    const Shape sh =
        shape_of(q, k, ctx->saved_data["window"].toInt(), ctx->saved_data["block_rows"].toInt(),
                 ctx->saved_data["key_block"].toInt());
    if (ctx->saved_data["fused"].toBool()) {
      variable_list grads_qkv = fused_backward(sh, q, k, v, out, lse, grads[0]);
      return {grads_qkv[0],    grads_qkv[1],    grads_qkv[2],   torch::Tensor(),
              torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    auto as5 = [&](const torch::Tensor& t) {
      return t.reshape({sh.b, sh.kv_heads, sh.group, sh.s, sh.d});
    };
    torch::Tensor q5 = as5(q), d_out5 = as5(grads[0]);
    // D_i = sum_j dO_ij O_ij: the softmax backward's row term, from the output.
    torch::Tensor row_dot = (grads[0] * out).sum(-1).view({sh.b, sh.kv_heads, sh.group, sh.s});
    torch::Tensor dq = torch::zeros({sh.b, sh.kv_heads, sh.group, sh.s, sh.d}, q.options());
    torch::Tensor dk = torch::zeros_like(k, torch::MemoryFormat::Contiguous);
    torch::Tensor dv = torch::zeros_like(v, torch::MemoryFormat::Contiguous);
    torch::Tensor k_t = k.transpose(-1, -2).contiguous(), v_t = v.transpose(-1, -2).contiguous();
    for (int64_t q0 = 0; q0 < sh.s; q0 += sh.block_rows) {
      const int64_t rows = std::min(sh.block_rows, sh.s - q0);
      torch::Tensor q_block = rows_of(q5, sh, q0, rows).mul(sh.scale);
      torch::Tensor d_out = rows_of(d_out5, sh, q0, rows);
      torch::Tensor lse_block = rows_of(lse, sh, q0, rows).unsqueeze(-1);
      torch::Tensor dot_block = rows_of(row_dot, sh, q0, rows).unsqueeze(-1);
      torch::Tensor dq_block;
      for (const KeyBlock& kb : key_blocks(sh, q0, rows)) {
        torch::Tensor p = block_scores(sh, q_block, k_t, q0, rows, kb).sub_(lse_block).exp_();
        dv.narrow(2, kb.begin, kb.size).add_(matmul_widening(p.transpose(-1, -2), d_out));
        torch::Tensor ds =
            matmul_widening(d_out, v_t.narrow(3, kb.begin, kb.size)).sub_(dot_block).mul_(p);
        torch::Tensor dq_part = matmul_widening(ds, k.narrow(2, kb.begin, kb.size));
        dq_block = dq_block.defined() ? dq_block.add_(dq_part) : dq_part;
        dk.narrow(2, kb.begin, kb.size).add_(matmul_widening(ds.transpose(-1, -2), q_block));
      }
      dq.narrow(3, q0, rows)
          .copy_(dq_block.mul_(sh.scale).view({sh.b, sh.kv_heads, sh.group, rows, sh.d}));
    }
    return {dq.view({sh.b, sh.kv_heads * sh.group, sh.s, sh.d}),
            dk,
            dv,
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor blocked_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, int64_t window, int64_t block_rows,
                                int64_t key_block, kernels::KernelMode mode) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "blocked_attention: 4-d q, k, v");
  TORCH_CHECK(q.size(1) % k.size(1) == 0,
              "blocked_attention: heads must be a multiple of kv_heads");
  TORCH_CHECK(q.size(2) == k.size(2), "blocked_attention: queries and keys of one length");
  TORCH_CHECK(block_rows > 0 && key_block > 0, "blocked_attention: block sizes must be positive");
  return BlockedAttention::apply(q, k, v, window, block_rows, key_block,
                                 fused_kernels_apply(mode, q, k, v));
}

}  // namespace retort::layers
