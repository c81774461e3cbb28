// layers/head_grad_sink.h: where the LM head weight's gradient goes when it is not left to
// autograd. A fused head given a sink delivers d(loss)/d(weight) during backward in blocks of
// vocabulary rows of this rank's shard, each block once, already scaled by the incoming
// gradient, so a receiver that steps the optimizer on each block (optimizer-in-backward) never
// needs the [vocab, hidden] gradient whole. Autograd then sees no gradient for the weight from
// the head. A receiver that only reduces it over DP (streams() false) takes it whole, as soon
// as the head's backward has run.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>

#include "common/memory_category.h"
#include "kernels/mixed_gemm.h"
#include "layers/accumulation_type.h"
#include "layers/grad_destinations.h"
#include "layers/widened_products.h"

namespace retort::layers {

class HeadGradSink {
 public:
  virtual ~HeadGradSink() = default;
  // true: the gradient comes in blocks formed in backward (the head forms its logits again
  // there), so it never exists whole. false: the receiver takes it whole, in one
  // take_rows(0, grad) call from backward, and the head may form it in forward as it does
  // without a sink (no second pass over the logits).
  virtual bool streams() const { return true; }
  // Rows per block for a weight shard of `rows` rows.
  virtual int64_t block_rows(int64_t rows) const = 0;
  // Rows [row_begin, row_begin + grad.size(0)) of the gradient; grad is the receiver's.
  virtual void take_rows(int64_t row_begin, torch::Tensor grad) = 0;
  // When streams() is false: memory the head may form the whole gradient in (the receiver's
  // own, e.g. where its DP sum reads it, so take_rows needs no copy); undefined: none.
  virtual torch::Tensor whole_gradient_memory() { return {}; }
  // true: the head forms nothing in forward or in its own backward; its backward hands over
  // (take_deferred) what forms the whole gradient later, when the receiver wants it.
  virtual bool defers() const { return false; }
  virtual void take_deferred(std::function<torch::Tensor()> form) {
    TORCH_CHECK(false, "this head gradient sink does not take a deferred gradient");
  }
};

// For a head tied to the embedding on the same stage: the head's whole gradient is kept
// here, not returned to autograd, until backward reaches the lookup, whose row-sparse gradient
// adds into it in place (vocab_parallel_embedding, add_lookup_gradient); the lookup returns
// the sum, which autograd adopts as .grad() or adds into it. Autograd, handed the dense and
// then the sparse gradient of one tensor, would sum them out of place: one more [vocab, h]
// tensor at the end of backward. The additions and their order are autograd's, so the sums
// are bitwise the same.
// Deferring (memory.defer_head_gradient), the head's backward leaves here only what forms its
// gradient, and the lookup's backward forms it, at the end of backward, when the saved
// activations are gone: the [vocab, h] gradient is never held beside them.
class TiedHeadGradientSink final : public HeadGradSink {
 public:
  explicit TiedHeadGradientSink(torch::Tensor weight) : weight_(std::move(weight)) {}
  // The run whose memory offered for the weight's gradient the head may form it in.
  void set_gradient_offers(GradDestinations* offers) { offers_ = offers; }
  void set_defers(bool defers) { defers_ = defers; }
  bool defers() const override { return defers_; }
  void take_deferred(std::function<torch::Tensor()> form) override {
    TORCH_CHECK(defers_ && !form_ && !head_grad_.defined(),
                "TiedHeadGradientSink takes one deferred gradient per backward");
    form_ = std::move(form);
  }
  bool streams() const override { return false; }
  int64_t block_rows(int64_t rows) const override { return rows; }
  void take_rows(int64_t row_begin, torch::Tensor grad) override {
    TORCH_CHECK(row_begin == 0 && grad.sizes() == weight_.sizes() && !head_grad_.defined(),
                "TiedHeadGradientSink takes one whole gradient per backward");
    head_grad_ = std::move(grad);
  }
  // Memory offered for the weight's gradient (layers/grad_destinations.h), when it has none.
  torch::Tensor whole_gradient_memory() override { return take_grad_destination(offers_, weight_); }
  // The lookup's gradient with the head's added, in the head's memory (the head's gradient
  // went to another sink, or nowhere: the lookup's alone).
  torch::Tensor add_lookup_gradient(const torch::Tensor& lookup_grad) {
    if (form_) {
      head_grad_ = form_();
      form_ = nullptr;
    }
    if (!head_grad_.defined()) return lookup_grad;
    torch::Tensor sum = std::move(head_grad_);
    head_grad_ = torch::Tensor();
    return sum.add_(lookup_grad);
  }

 private:
  torch::Tensor weight_;
  GradDestinations* offers_ = nullptr;
  torch::Tensor head_grad_;  // from the head's backward until the lookup's
  bool defers_ = false;
  std::function<torch::Tensor()> form_;  // deferred: from the head's backward to the lookup's
};

// A zeroed tensor of weight's shape, in accumulation_type (a 16-bit weight's gradient is summed
// over chunks of tokens in float32, each chunk's product rounded once), for the head weight's whole
// gradient: the sink's memory when it offers some of that shape and type; without a sink (the
// gradient goes back to autograd) memory the run offered for the weight's gradient
// (layers/grad_destinations.h; `offers` null: none); else a new tensor, filed as gradient memory:
// formed in forward, it is the weight's gradient from then on, not an activation kept for backward.
inline torch::Tensor zeroed_whole_gradient(HeadGradSink* sink, const torch::Tensor& weight,
                                           GradDestinations* offers) {
  torch::Tensor memory =
      sink ? sink->whole_gradient_memory() : take_grad_destination(offers, weight);
  const torch::ScalarType type = accumulation_type(weight);
  if (memory.defined() && memory.sizes() == weight.sizes() && memory.scalar_type() == type &&
      memory.is_contiguous())
    return memory.zero_();
  MemoryScope gradient(MemoryCategory::gradients);
  return torch::zeros(weight.sizes(), weight.options().dtype(type));
}

// grad += a^T b, summed in grad's type. A bf16 product into a float32 sum goes through the
// BLAS's mixed product where the process has one (kernels/mixed_gemm.h): formed in float32 and
// added in the same call; on a GPU, ATen's product with a float32 result, then added. Otherwise a
// 16-bit product is rounded once, then added, a block of grad's rows at a time, so its temporaries
// (the product and the BLAS's float32 result behind it) stay a few MB, not two more copies of a
// [vocab, h] head gradient.
inline void add_transposed_product(torch::Tensor& grad, const torch::Tensor& a,
                                   const torch::Tensor& b) {
  if (grad.scalar_type() == a.scalar_type()) {
    add_mm_widening(grad, a.t(), b);
    return;
  }
  const bool mixed = grad.scalar_type() == torch::kFloat && a.scalar_type() == torch::kBFloat16 &&
                     b.scalar_type() == torch::kBFloat16 && grad.device().is_cpu() &&
                     a.dim() == 2 && b.dim() == 2 && grad.dim() == 2 && a.stride(1) == 1 &&
                     b.stride(1) == 1 && grad.stride(1) == 1 && kernels::bf16_gemm_f32_available();
  // A GPU has the mixed product (cuBLAS through ATen's out_dtype): one product per chunk of
  // tokens with a float32 result, added whole.
  if (grad.is_cuda() && grad.scalar_type() == torch::kFloat &&
      a.scalar_type() == torch::kBFloat16 && b.scalar_type() == torch::kBFloat16) {
    grad.add_(at::mm(a.t(), b, torch::kFloat));
    return;
  }
  if (mixed) {
    kernels::bf16_gemm_f32(
        /*trans_a=*/true, /*trans_b=*/false, grad.size(0), grad.size(1), a.size(0), 1.0f,
        reinterpret_cast<const kernels::Bf16*>(a.data_ptr<at::BFloat16>()), a.stride(0),
        reinterpret_cast<const kernels::Bf16*>(b.data_ptr<at::BFloat16>()), b.stride(0), 1.0f,
        grad.data_ptr<float>(), grad.stride(0));
    return;
  }
  const int64_t rows = grad.size(0), block = std::max<int64_t>(256, (int64_t(1) << 20) / b.size(1));
  for (int64_t row = 0; row < rows; row += block) {
    const int64_t count = std::min(block, rows - row);
    torch::Tensor rows = grad.narrow(0, row, count);
    add_mm_widening(rows, a.narrow(1, row, count).t(), b);
  }
}

// sum += a b, summed in sum's type (as above).
inline void add_product(torch::Tensor sum, const torch::Tensor& a, const torch::Tensor& b) {
  add_mm_widening(sum, a, b);
}

// The head weight's whole gradient, formed in forward and scaled in backward: to a sink that
// takes it whole (then autograd gets none: the undefined tensor returned), else returned for
// autograd.
inline torch::Tensor deliver_whole_gradient(HeadGradSink* sink, const torch::Tensor& grad) {
  if (!sink || !grad.defined()) return grad;
  sink->take_rows(0, grad);
  return torch::Tensor();
}

}  // namespace retort::layers
