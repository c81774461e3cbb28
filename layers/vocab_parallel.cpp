// layers/vocab_parallel.cpp: see vocab_parallel.h.
#include "layers/vocab_parallel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "common/saved_object.h"
#include "kernels/row_loops.h"
#include "layers/accumulation_type.h"
#include "layers/compute_copy.h"
#include "layers/kernel_route.h"
#include "layers/linear_products.h"
#include "layers/widened_products.h"

namespace retort::layers {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
constexpr int64_t kIgnore = -100;

void all_reduce(torch::Tensor& t, parallel::Communicator* group, parallel::ReduceOp op) {
  if (group->size() > 1) group->all_reduce(t, op);
}

// Per-token cross-entropy over a vocabulary split across the group.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor logits, torch::Tensor targets,
                               int64_t vocab_start, int64_t vocab_size,
                               parallel::Communicator* group) {
    const int64_t local = logits.size(-1);
    torch::Tensor z = logits.reshape({-1, local}).to(accumulation_type(logits));
    torch::Tensor t = targets.reshape({-1});
    torch::Tensor ids = torch::arange(vocab_start, vocab_start + local, t.options());
    torch::Tensor padded = ids >= vocab_size;
    z = z.masked_fill(padded, -std::numeric_limits<double>::infinity());

    torch::Tensor max = std::get<0>(z.max(-1)).contiguous();
    all_reduce(max, group, parallel::ReduceOp::Max);
    torch::Tensor shifted = z - max.unsqueeze(-1);

    torch::Tensor in_range = (t >= vocab_start) & (t < vocab_start + local);
    torch::Tensor local_index = torch::where(in_range, t - vocab_start, torch::zeros_like(t));
    // where(), not a product with the mask: a rank holding only padding has -inf logits.
    torch::Tensor target_logit =
        torch::where(in_range, shifted.gather(1, local_index.unsqueeze(1)).squeeze(1),
                     torch::zeros({}, shifted.options()));
    target_logit = target_logit.contiguous();
    all_reduce(target_logit, group, parallel::ReduceOp::Sum);

    torch::Tensor exp = shifted.exp();
    torch::Tensor sum_exp = exp.sum(-1).contiguous();
    all_reduce(sum_exp, group, parallel::ReduceOp::Sum);

    torch::Tensor keep = t.ne(kIgnore).to(shifted.dtype());
    torch::Tensor loss = (sum_exp.log() - target_logit) * keep;
    // Saved for backward: softmax over the local slice and where the target sits.
    torch::Tensor softmax = exp.div_(sum_exp.unsqueeze(-1));
    ctx->save_for_backward({softmax, local_index, (in_range & t.ne(kIgnore)), keep});
    ctx->saved_data["shape"] = logits.sizes().vec();
    ctx->saved_data["logits_type"] = int64_t(logits.scalar_type());
    return loss.view(targets.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor softmax = saved[0], local_index = saved[1], hit = saved[2], keep = saved[3];
    torch::Tensor g = grad_outputs[0].reshape({-1}) * keep;
    torch::Tensor grad = softmax * g.unsqueeze(-1);
    grad.scatter_add_(1, local_index.unsqueeze(1), (-g * hit.to(g.dtype())).unsqueeze(1));
    auto shape = ctx->saved_data["shape"].toIntVector();
    const auto logits_type = torch::ScalarType(ctx->saved_data["logits_type"].toInt());
    return {grad.view(shape).to(logits_type), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// How the fused head runs: its products as the run's (kernel mode, compute copies, gradient
// memory; layers/run_context.h), and its element-wise
// steps as row loops (kernels/row_loops.h) alone on the vocabulary where the policy allows and
// the dispatch routes x's device and dtype to them, else as torch ops combined over the TP group.
struct HeadRoute {
  RunContext* run = nullptr;
  bool loops = false;
};

HeadRoute head_route(const KernelPolicy& policy, const torch::Tensor& x,
                     parallel::Communicator* group) {
  HeadRoute route;
  route.run = policy.run;
  // The loops read the logits in the products' type (bf16 logits: float32 inside the loop).
  route.loops = policy.head_row_loops && group->size() == 1 &&
                runs_our_loops(policy.mode(), kernels::Operation::head_cross_entropy,
                               torch::empty({0}, x.options()));
  return route;
}

// kernels::cross_entropy_rows over the rows of logits z [len, local] (float, double or
// bf16, in place) with per-row outputs in z's accumulation type, split across threads.
void cross_entropy_rows_of(torch::Tensor& z, int64_t real, const torch::Tensor& index,
                           torch::Tensor& max, torch::Tensor& sum, torch::Tensor& loss,
                           const torch::Tensor* scale) {
  const int64_t len = z.size(0), local = z.size(1), stride = z.stride(0);
  auto run = [&](auto* zp, auto* acc) {
    using acc_t = std::remove_pointer_t<decltype(acc)>;
    at::parallel_for(0, len, 4, [&](int64_t b, int64_t e) {
      kernels::cross_entropy_rows(zp + b * stride, e - b, local, real, stride,
                                  index.data_ptr<int64_t>() + b, max.data_ptr<acc_t>() + b,
                                  sum.data_ptr<acc_t>() + b, loss.data_ptr<acc_t>() + b,
                                  scale ? scale->data_ptr<acc_t>() + b : nullptr);
    });
  };
  if (z.scalar_type() == torch::kBFloat16)
    run(reinterpret_cast<kernels::Bf16*>(z.data_ptr<at::BFloat16>()), (float*)nullptr);
  else
    AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "cross_entropy_rows",
                               [&] { run(z.data_ptr<scalar_t>(), (scalar_t*)nullptr); });
}

// kernels::softmax_gradient_rows over logits z [len, rows] (in place), the per-token max, sum
// and scale from `first` on, in z's accumulation type.
void softmax_gradient_rows_of(torch::Tensor& z, int64_t real, const torch::Tensor& max,
                              const torch::Tensor& sum, int64_t first, const torch::Tensor& scale,
                              const torch::Tensor& index) {
  const int64_t len = z.size(0), rows = z.size(1), stride = z.stride(0);
  auto run = [&](auto* zp, auto* acc) {
    using acc_t = std::remove_pointer_t<decltype(acc)>;
    const acc_t *mp = max.data_ptr<acc_t>() + first, *sp = sum.data_ptr<acc_t>() + first;
    at::parallel_for(0, len, 4, [&](int64_t b, int64_t e) {
      kernels::softmax_gradient_rows(zp + b * stride, e - b, rows, real, stride, mp + b, sp + b,
                                     scale.data_ptr<acc_t>() + b, index.data_ptr<int64_t>() + b);
    });
  };
  if (z.scalar_type() == torch::kBFloat16)
    run(reinterpret_cast<kernels::Bf16*>(z.data_ptr<at::BFloat16>()), (float*)nullptr);
  else
    AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "softmax_gradient_rows",
                               [&] { run(z.data_ptr<scalar_t>(), (scalar_t*)nullptr); });
}

// The fused head: the loss, and when asked the gradients for a unit upstream gradient.
struct FusedHeadResult {
  torch::Tensor loss_sum, grad_x, grad_weight;
  torch::Tensor max, sum_exp;  // per token, when asked: what backward needs to re-form softmax
};

FusedHeadResult fused_head_forward(const torch::Tensor& x2d, const torch::Tensor& weight,
                                   const torch::Tensor& t, int64_t vocab_start, int64_t vocab_size,
                                   parallel::Communicator* group, int64_t chunk,
                                   const HeadRoute& route, bool want_x, bool want_weight,
                                   bool want_stats = false, HeadGradSink* sink = nullptr) {
  const int64_t n = x2d.size(0), local = weight.size(0);
  torch::Tensor ids = torch::arange(vocab_start, vocab_start + local, t.options());
  torch::Tensor padded = ids >= vocab_size;
  const bool any_padded = vocab_start + local > vocab_size;
  FusedHeadResult result;
  const torch::TensorOptions softmax_options = x2d.options().dtype(accumulation_type(x2d));
  result.loss_sum = torch::zeros({}, softmax_options);
  if (want_x) result.grad_x = torch::empty_like(x2d);
  if (want_weight)
    result.grad_weight = zeroed_whole_gradient(sink, weight, gradients_of(route.run));
  if (want_stats) {
    result.max = torch::empty({n}, softmax_options);
    result.sum_exp = torch::empty({n}, softmax_options);
  }
  // Alone on the vocabulary, the softmax and its gradient are one loop per row
  // (kernels::cross_entropy_rows); the streamed form's backward forms the same gradient again
  // with kernels::softmax_gradient_rows.
  const bool loops = route.loops;
  const int64_t real = std::clamp<int64_t>(vocab_size - vocab_start, 0, local);
  // Cast once for every chunk (a compute copy not kept would be cast again at each use).
  const torch::Tensor used = weight_in(copies_of(route.run), weight, x2d.scalar_type());
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    torch::Tensor xc = x2d.narrow(0, start, len), tc = t.narrow(0, start, len);
    // [len, local] in the products' type, reused in place below
    torch::Tensor z = product_by_transposed(xc, used, route.run);
    if (loops) {  // the loops read bf16 logits as they are: no float32 copy of the chunk
      const bool want_grad = want_x || want_weight;
      torch::Tensor keep = tc.ne(kIgnore).to(softmax_options.dtype()).contiguous();
      torch::Tensor index =
          torch::where(tc.ne(kIgnore), tc - vocab_start, torch::full_like(tc, -1)).contiguous();
      torch::Tensor max = torch::empty({len}, softmax_options), sum = torch::empty_like(max);
      torch::Tensor loss = torch::empty_like(max);
      cross_entropy_rows_of(z, real, index, max, sum, loss, want_grad ? &keep : nullptr);
      result.loss_sum += loss.sum();
      if (want_stats) {
        result.max.narrow(0, start, len).copy_(max);
        result.sum_exp.narrow(0, start, len).copy_(sum);
      }
      if (!want_grad) continue;
      const torch::Tensor& dz = z;  // the gradient, in the products' type
      if (want_x) {                 // written in place: grad_x rows are contiguous
        torch::Tensor rows = result.grad_x.narrow(0, start, len);
        product_by_out(rows, dz, used, route.run);
      }
      if (want_weight) add_transposed_product(result.grad_weight, dz, xc);
      continue;
    }
    z = z.to(softmax_options.dtype());
    if (any_padded) z.masked_fill_(padded, -std::numeric_limits<double>::infinity());
    torch::Tensor max = std::get<0>(z.max(-1)).contiguous();
    all_reduce(max, group, parallel::ReduceOp::Max);
    z.sub_(max.unsqueeze(-1));
    torch::Tensor in_range = (tc >= vocab_start) & (tc < vocab_start + local);
    torch::Tensor local_index = torch::where(in_range, tc - vocab_start, torch::zeros_like(tc));
    // where(), not a product with the mask: a rank holding only padding has -inf logits.
    torch::Tensor target_logit =
        torch::where(in_range, z.gather(1, local_index.unsqueeze(1)).squeeze(1),
                     torch::zeros({}, z.options()))
            .contiguous();
    all_reduce(target_logit, group, parallel::ReduceOp::Sum);
    z.exp_();
    torch::Tensor sum_exp = z.sum(-1).contiguous();
    all_reduce(sum_exp, group, parallel::ReduceOp::Sum);
    if (want_stats) {
      result.max.narrow(0, start, len).copy_(max);
      result.sum_exp.narrow(0, start, len).copy_(sum_exp);
    }
    torch::Tensor keep = tc.ne(kIgnore).to(z.dtype());
    result.loss_sum += ((sum_exp.log() - target_logit) * keep).sum();
    if (!want_x && !want_weight) continue;
    // d(loss)/d(logits) = (softmax - onehot(target)) for counted tokens.
    z.div_(sum_exp.unsqueeze(-1)).mul_(keep.unsqueeze(-1));
    z.scatter_add_(1, local_index.unsqueeze(1),
                   (-keep * (in_range & tc.ne(kIgnore)).to(z.dtype())).unsqueeze(1));
    z = z.to(x2d.scalar_type());  // the products run in the activations' type
    if (want_x) result.grad_x.narrow(0, start, len).copy_(matmul_widening(z, used));
    if (want_weight) add_transposed_product(result.grad_weight, z, xc);
  }
  return result;
}

struct FusedHeadCrossEntropy : torch::autograd::Function<FusedHeadCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x2d, torch::Tensor weight,
                               torch::Tensor targets, int64_t vocab_start, int64_t vocab_size,
                               parallel::Communicator* group, int64_t chunk, HeadGradSink* sink,
                               HeadRoute route) {
    FusedHeadResult result =
        fused_head_forward(x2d, weight, targets, vocab_start, vocab_size, group, chunk, route,
                           x2d.requires_grad(), weight.requires_grad(), false, sink);
    ctx->save_for_backward({result.grad_x, result.grad_weight});
    save_object(ctx, "sink", sink);
    return result.loss_sum;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& g = grad_outputs[0];
    // Scaled in place: the buffers are ours alone, and a [vocab, h] copy is what the fused
    // head exists to avoid.
    torch::Tensor grad_x = saved[0].defined() ? saved[0].mul_(g) : torch::Tensor();
    torch::Tensor grad_weight = saved[1].defined() ? saved[1].mul_(g) : torch::Tensor();
    // Taken whole by a sink that does not stream (HeadGradSink::streams() false).
    grad_weight = deliver_whole_gradient(saved_object<HeadGradSink*>(ctx, "sink"), grad_weight);
    return {grad_x,          grad_weight,     torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// What backward needs to form the fused head's softmax again: the forward's input and
// targets, and its per-token max and sum of exponentials.
struct HeadReplay {
  torch::Tensor x2d, targets, max, sum_exp;
  int64_t vocab_start = 0, vocab_size = 0, chunk = 0;
  HeadRoute route;
};

// Adds d(loss sum)/d(weight) for rows [row, row + w.size(0)) of this rank's shard, for a unit
// upstream gradient, into grad [rows, h] (accumulation type); w: those rows as the forward
// multiplied by them. Chunk of tokens by chunk, as the forward.
void add_head_gradient_rows(torch::Tensor grad, const torch::Tensor& w, int64_t row,
                            const HeadReplay& r) {
  const torch::Tensor& t = r.targets;
  const int64_t n = r.x2d.size(0), rows = w.size(0), first_id = r.vocab_start + row;
  const torch::Tensor keep = t.ne(kIgnore).to(accumulation_type(r.x2d));
  const torch::Tensor padded =
      torch::arange(first_id, first_id + rows, t.options()) >= r.vocab_size;
  const bool any_padded = first_id + rows > r.vocab_size;
  for (int64_t start = 0; start < n; start += r.chunk) {
    const int64_t len = std::min(r.chunk, n - start);
    torch::Tensor xc = r.x2d.narrow(0, start, len), tc = t.narrow(0, start, len);
    torch::Tensor kc = keep.narrow(0, start, len);
    // The forward's own product (same rows and inner dimension, so the same route): each
    // logit of the block is then bitwise the forward's, whatever the BLAS's kernels.
    torch::Tensor z = product_by_transposed(xc, w, r.route.run);
    if (r.route.loops) {  // as the forward's loop formed it, in the logits' own type
      torch::Tensor in_block = (tc >= first_id) & (tc < first_id + rows) & tc.ne(kIgnore);
      torch::Tensor index =
          torch::where(in_block, tc - first_id, torch::full_like(tc, -1)).contiguous();
      const int64_t real = std::clamp<int64_t>(r.vocab_size - first_id, 0, rows);
      softmax_gradient_rows_of(z, real, r.max, r.sum_exp, start, kc.contiguous(), index);
      add_transposed_product(grad, z, xc);
      continue;
    }
    z = z.to(accumulation_type(r.x2d));
    if (any_padded) z.masked_fill_(padded, -std::numeric_limits<double>::infinity());
    z.sub_(r.max.narrow(0, start, len).unsqueeze(-1)).exp_();
    z.div_(r.sum_exp.narrow(0, start, len).unsqueeze(-1)).mul_(kc.unsqueeze(-1));
    torch::Tensor in_block = (tc >= first_id) & (tc < first_id + rows);
    torch::Tensor index = torch::where(in_block, tc - first_id, torch::zeros_like(tc));
    z.scatter_add_(1, index.unsqueeze(1),
                   (-kc * (in_block & tc.ne(kIgnore)).to(z.dtype())).unsqueeze(1));
    add_transposed_product(grad, z.to(r.x2d.scalar_type()), xc);
  }
}

// Rows of the head weight in the products' type: slices of its compute copy, or, where copies
// are not kept, each block of rows cast alone (no whole copy of the head in backward).
class HeadRowsInType {
 public:
  HeadRowsInType(const torch::Tensor& weight, torch::ScalarType type, ComputeCopies* copies)
      : weight_(weight),
        type_(type),
        used_(compute_copies_kept(copies) || weight.scalar_type() == type
                  ? weight_in(copies, weight, type)
                  : torch::Tensor()) {}
  torch::Tensor operator()(int64_t row, int64_t rows) const {
    return used_.defined() ? used_.narrow(0, row, rows) : weight_.narrow(0, row, rows).to(type_);
  }

 private:
  torch::Tensor weight_;
  torch::ScalarType type_;
  torch::Tensor used_;
};

// The same loss with the weight's gradient formed in backward, for a sink that streams or
// defers it. Forward keeps the input, the per-token max and sum of exponentials, and forms
// d/dx as above. Backward forms the softmax again block of rows by block (the same
// element-wise steps as the forward, so the same values) and each block's gradient, chunk of
// tokens by chunk:
// - streamed (HeadGradSink::streams): each block, scaled, to the sink as it is formed;
// - deferred (HeadGradSink::defers): backward only leaves the sink what forms the whole
//   gradient later, where the sink wants it.
// Where compute copies are not kept, each block's rows are cast as it goes (HeadRowsInType).
struct ReplayedHeadCrossEntropy : torch::autograd::Function<ReplayedHeadCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x2d, torch::Tensor weight,
                               torch::Tensor targets, int64_t vocab_start, int64_t vocab_size,
                               parallel::Communicator* group, int64_t chunk, HeadGradSink* sink,
                               HeadRoute route) {
    FusedHeadResult result =
        fused_head_forward(x2d, weight, targets, vocab_start, vocab_size, group, chunk, route,
                           x2d.requires_grad(), false, true);
    ctx->save_for_backward({x2d, weight, targets, result.max, result.sum_exp, result.grad_x});
    ctx->saved_data["vocab_start"] = vocab_start;
    ctx->saved_data["vocab_size"] = vocab_size;
    ctx->saved_data["chunk"] = chunk;
    save_object(ctx, "sink", sink);
    save_object(ctx, "run", route.run);
    ctx->saved_data["loops"] = route.loops;
    return result.loss_sum;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    HeadReplay replay;
    replay.x2d = saved[0];
    replay.targets = saved[2];
    replay.max = saved[3];
    replay.sum_exp = saved[4];
    replay.vocab_start = ctx->saved_data["vocab_start"].toInt();
    replay.vocab_size = ctx->saved_data["vocab_size"].toInt();
    replay.chunk = ctx->saved_data["chunk"].toInt();
    replay.route.run = saved_object<RunContext*>(ctx, "run");
    replay.route.loops = ctx->saved_data["loops"].toBool();
    const torch::Tensor weight = saved[1], g = grad_outputs[0];
    HeadGradSink* sink = saved_object<HeadGradSink*>(ctx, "sink");
    if (sink->defers())
      sink->take_deferred([replay, weight, g, sink] { return deferred(replay, weight, g, sink); });
    else
      stream(replay, weight, g, sink);
    torch::Tensor grad_x = saved[5].defined() ? saved[5].mul_(g) : torch::Tensor();
    return {grad_x,          torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

  static void stream(const HeadReplay& replay, const torch::Tensor& weight, const torch::Tensor& g,
                     HeadGradSink* sink) {
    torch::NoGradGuard no_grad;
    const int64_t local = weight.size(0);
    const int64_t block = std::max<int64_t>(1, sink->block_rows(local));
    // Each block's rows as the forward multiplied by them, taken before the sink steps them.
    const HeadRowsInType rows_in(weight, replay.x2d.scalar_type(), copies_of(replay.route.run));
    for (int64_t row = 0; row < local; row += block) {
      const int64_t rows = std::min(block, local - row);
      torch::Tensor grad =
          torch::zeros({rows, weight.size(1)}, weight.options().dtype(accumulation_type(weight)));
      add_head_gradient_rows(grad, rows_in(row, rows), row, replay);
      sink->take_rows(row, grad.mul_(g));
    }
  }

  static torch::Tensor deferred(const HeadReplay& replay, const torch::Tensor& weight,
                                const torch::Tensor& g, HeadGradSink* sink) {
    torch::NoGradGuard no_grad;
    torch::Tensor whole = zeroed_whole_gradient(sink, weight, gradients_of(replay.route.run));
    const HeadRowsInType rows_in(weight, replay.x2d.scalar_type(), copies_of(replay.route.run));
    // Rows per block: a block's logits for one chunk of tokens stay near 2^20 elements.
    const int64_t local = weight.size(0);
    const int64_t block = std::max<int64_t>(256, (int64_t(1) << 20) / replay.chunk);
    for (int64_t row = 0; row < local; row += block) {
      const int64_t rows = std::min(block, local - row);
      add_head_gradient_rows(whole.narrow(0, row, rows), rows_in(row, rows), row, replay);
    }
    return whole.mul_(g);
  }
};

// An embedding lookup with a row-sparse gradient (one row per token, uncoalesced, as
// torch's sparse embedding backward gives) that saves the indices only: torch's saves the
// weight, whose version check would refuse rows stepped before backward reaches the lookup
// (optimizer-in-backward steps the tied head's rows first).
// With a tied head's sink holding the head's dense gradient, backward returns that gradient
// with the rows added in place instead.
struct SparseRowLookup : torch::autograd::Function<SparseRowLookup> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor weight, torch::Tensor index,
                               TiedHeadGradientSink* tied_head) {
    ctx->save_for_backward({index});
    save_object(ctx, "tied_head", tied_head);
    ctx->saved_data["rows"] = weight.size(0);
    auto shape = index.sizes().vec();
    shape.push_back(weight.size(1));
    return weight.index_select(0, index.reshape({-1})).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const torch::Tensor index = ctx->get_saved_variables()[0].reshape({1, -1});
    const torch::Tensor& grad = grad_outputs[0];
    const int64_t width = grad.size(-1);
    torch::Tensor values = grad.reshape({-1, width});
    torch::Tensor rows = torch::_sparse_coo_tensor_unsafe(
        index, values, {ctx->saved_data["rows"].toInt(), width}, grad.options());
    TiedHeadGradientSink* tied_head = saved_object<TiedHeadGradientSink*>(ctx, "tied_head");
    return {tied_head ? tied_head->add_lookup_gradient(rows) : rows, torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_head_cross_entropy_sum(const torch::Tensor& x, const torch::Tensor& weight,
                                           const torch::Tensor& targets, int64_t vocab_size,
                                           const TensorParallel& tp, int64_t chunk_tokens,
                                           HeadGradSink* weight_grad_sink,
                                           const KernelPolicy& kernels) {
  TORCH_CHECK(chunk_tokens > 0, "fused head: chunk_tokens must be positive");
  const int64_t start = tp.rank() * weight.size(0);
  torch::Tensor x2d = x.reshape({-1, x.size(-1)});
  torch::Tensor t = targets.reshape({-1});
  const HeadRoute route = head_route(kernels, x2d, tp.group);
  if (!torch::GradMode::is_enabled())
    return fused_head_forward(x2d, weight, t, start, vocab_size, tp.group, chunk_tokens, route,
                              false, false)
        .loss_sum;
  // Formed in backward for a sink that streams it or defers it.
  if (weight_grad_sink && weight.requires_grad() &&
      (weight_grad_sink->streams() || weight_grad_sink->defers()))
    return ReplayedHeadCrossEntropy::apply(x2d, weight, t, start, vocab_size, tp.group,
                                           chunk_tokens, weight_grad_sink, route);
  return FusedHeadCrossEntropy::apply(x2d, weight, t, start, vocab_size, tp.group, chunk_tokens,
                                      weight.requires_grad() ? weight_grad_sink : nullptr, route);
}

torch::Tensor vocab_parallel_embedding(const torch::Tensor& tokens, const torch::Tensor& weight,
                                       const TensorParallel& tp, bool sparse_grad,
                                       std::optional<torch::ScalarType> type,
                                       TiedHeadGradientSink* tied_head) {
  auto lookup = [&](const torch::Tensor& index) {
    torch::Tensor rows = sparse_grad && weight.requires_grad() && torch::GradMode::is_enabled()
                             ? SparseRowLookup::apply(weight, index, tied_head)
                             : torch::embedding(weight, index, /*padding_idx=*/-1,
                                                /*scale_grad_by_freq=*/false, false);
    // Only the rows looked up are cast (their gradient returns in the weight's type).
    return type && *type != rows.scalar_type() ? rows.to(*type) : rows;
  };
  if (tp.size() == 1) return lookup(tokens);
  const int64_t local = weight.size(0), start = tp.rank() * local;
  torch::Tensor in_range = (tokens >= start) & (tokens < start + local);
  torch::Tensor index = torch::where(in_range, tokens - start, torch::zeros_like(tokens));
  torch::Tensor rows = lookup(index);
  torch::Tensor partial = rows * in_range.unsqueeze(-1).to(rows.scalar_type());
  return tp.exit_row(partial);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_size,
                                           const TensorParallel& tp) {
  const int64_t start = tp.rank() * logits.size(-1);
  return VocabParallelCrossEntropy::apply(logits, targets, start, vocab_size, tp.group);
}

torch::Tensor mask_padded_logits(const torch::Tensor& logits, int64_t vocab_size,
                                 const TensorParallel& tp) {
  const int64_t local = logits.size(-1), start = tp.rank() * local;
  if (start + local <= vocab_size) return logits;
  torch::Tensor ids = torch::arange(start, start + local, logits.options().dtype(torch::kLong));
  return logits.masked_fill(ids >= vocab_size, -std::numeric_limits<double>::infinity());
}

}  // namespace retort::layers
