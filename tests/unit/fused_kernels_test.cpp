// tests/unit/fused_kernels_test.cpp: the fused kernels (layers/fused_ops.h) and the blocked
// attention (layers/blocked_attention.h) against the composed torch ops of
// layers/functional.h: outputs and every input gradient, in float64 (to round-off) and in
// float32 against a float64 reference (within fp32 round-off). Shapes are chosen to expose
// the easy mistakes: row counts that do not split evenly across threads, sequences that are
// not a multiple of the block, windows shorter than a block (rows with no visible key in a
// key block), several key blocks (the online softmax), GQA.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/observe/memory_tracker.h"
#include "kernels/row_loops.h"
#include "kernels/tile_gemm.h"
#include "layers/blocked_attention.h"
#include "layers/functional.h"
#include "layers/fused_ops.h"
#include "layers/model.h"
#include "layers/parallel_linear.h"
#include "layers/vocab_parallel.h"

using namespace retort::layers;
namespace kernels = retort::kernels;

namespace {

// max |a - b| relative to max |b|, or to 1 when b is smaller: every input and seed here is
// O(1), and some exact gradients are zero (a window of 1 gives zero dq and dk).
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1.0);
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

// Outputs and gradients of fn on copies of inputs (leaves requiring grad), seeded with seed.
struct Outcome {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;
};
template <typename Fn>
Outcome run(const Fn& fn, const std::vector<torch::Tensor>& inputs, const torch::Tensor& seed) {
  std::vector<torch::Tensor> leaves;
  for (const torch::Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  Outcome r;
  r.out = fn(leaves);
  r.out.backward(seed.to(r.out.scalar_type()));
  for (const torch::Tensor& t : leaves) r.grads.push_back(t.grad());
  return r;
}

// fused in `dtype` against reference in float64, both on the same inputs.
template <typename Fused, typename Reference>
void expect_match(const Fused& fused, const Reference& reference,
                  const std::vector<torch::Tensor>& inputs64, const torch::Tensor& seed64,
                  torch::ScalarType dtype, double tolerance) {
  std::vector<torch::Tensor> inputs;
  for (const torch::Tensor& t : inputs64) inputs.push_back(t.to(dtype));
  Outcome got = run(fused, inputs, seed64.to(dtype));
  Outcome want = run(reference, inputs64, seed64);
  EXPECT_EQ(got.out.scalar_type(), dtype);
  EXPECT_LT(relative_error(got.out, want.out), tolerance) << "output";
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_LT(relative_error(got.grads[i], want.grads[i]), tolerance) << "gradient of input " << i;
}

constexpr double kFloat64Tol = 1e-12, kFloat32Tol = 2e-5;

}  // namespace

TEST(FusedKernels, RmsNormMatchesComposedOps) {
  torch::manual_seed(1);
  for (int64_t rows : {1, 7, 203}) {
    const int64_t n = 96;
    torch::Tensor x = torch::randn({rows, n}, torch::kDouble) * 3 + 0.5;
    torch::Tensor w = torch::randn({n}, torch::kDouble);
    torch::Tensor seed = torch::randn({rows, n}, torch::kDouble);
    auto fused = [](const std::vector<torch::Tensor>& in) {
      return fused_rms_norm(in[0], in[1], 1e-5);
    };
    auto reference = [](const std::vector<torch::Tensor>& in) {
      return rms_norm(in[0], in[1], 1e-5);
    };
    SCOPED_TRACE(rows);
    expect_match(fused, reference, {x, w}, seed, torch::kDouble, kFloat64Tol);
    expect_match(fused, reference, {x, w}, seed, torch::kFloat, kFloat32Tol);
  }
}

TEST(FusedKernels, RmsNormWeightGradientDoesNotDependOnThreads) {
  torch::manual_seed(2);
  torch::Tensor x = torch::randn({301, 64}), w = torch::randn({64}), seed = torch::randn({301, 64});
  auto weight_grad = [&](int threads) {
    const int before = torch::get_num_threads();
    torch::set_num_threads(threads);
    Outcome r =
        run([](const std::vector<torch::Tensor>& in) { return fused_rms_norm(in[0], in[1], 1e-6); },
            {x, w}, seed);
    torch::set_num_threads(before);
    return r.grads[1];
  };
  torch::Tensor one = weight_grad(1), two = weight_grad(2);
  EXPECT_LT(relative_error(one, two), kFloat32Tol);
}

TEST(FusedKernels, SwigluMatchesComposedOpsIncludingLargeGates) {
  torch::manual_seed(3);
  const int64_t n = 333;
  torch::Tensor gate_up = torch::randn({5, 2 * n}, torch::kDouble) * 4;  // [gate | up] rows
  gate_up[0][0] = 95.0;  // beyond the float exp's clamp on either side
  gate_up[0][1] = -95.0;
  gate_up[0][2] = 0.0;
  torch::Tensor seed = torch::randn({5, n}, torch::kDouble);
  auto fused = [](const std::vector<torch::Tensor>& in) { return fused_swiglu_packed(in[0]); };
  auto reference = [n](const std::vector<torch::Tensor>& in) {
    return torch::silu(in[0].narrow(1, 0, n)) * in[0].narrow(1, n, n);
  };
  expect_match(fused, reference, {gate_up}, seed, torch::kDouble, kFloat64Tol);
  expect_match(fused, reference, {gate_up}, seed, torch::kFloat, kFloat32Tol);
  // Element by element too: the float loop's own exp must be good to a few ulp everywhere,
  // not only against the largest element.
  torch::Tensor in32 = gate_up.to(torch::kFloat);
  torch::Tensor got = fused_swiglu_packed(in32).to(torch::kDouble);
  torch::Tensor want = reference({in32.to(torch::kDouble)});
  EXPECT_LT(((got - want).abs() / (want.abs() + 1e-6)).max().item<double>(), 2e-6);
}

TEST(FusedKernels, RopeInPlaceMatchesRotateHalf) {
  torch::manual_seed(4);
  const int64_t b = 3, s = 11, heads = 5, d = 16;
  auto [cos64, sin64] = rope_tables(s, d, 500.0, 0, torch::TensorOptions().dtype(torch::kDouble));
  torch::Tensor x = torch::randn({b, s, heads * d}, torch::kDouble);
  torch::Tensor seed = torch::randn({b, s, heads * d}, torch::kDouble);
  // All heads, and the first 3 of 5 (q and k inside a packed q|k|v row; v left alone).
  for (int64_t rotated : {heads, int64_t(3)}) {
    for (torch::ScalarType dtype : {torch::kDouble, torch::kFloat}) {
      SCOPED_TRACE(::testing::Message() << "rotated heads " << rotated << ", " << dtype);
      torch::Tensor cos = cos64.to(dtype), sin = sin64.to(dtype);
      // As in the attention: rotate the output of a projection (a non-leaf), in place.
      auto fused = [&](const std::vector<torch::Tensor>& in) {
        torch::Tensor projected = in[0] * 1.0;
        torch::Tensor turned = fused_rope_(projected, cos, sin, rotated);
        EXPECT_EQ(turned.data_ptr(), projected.data_ptr()) << "not in place";
        return turned;
      };
      auto reference = [&](const std::vector<torch::Tensor>& in) {
        torch::Tensor per_head = in[0].view({b, s, heads, d});
        torch::Tensor turned =
            apply_rope(per_head.narrow(2, 0, rotated).transpose(1, 2), cos64, sin64);
        torch::Tensor kept = per_head.narrow(2, rotated, heads - rotated);
        return torch::cat({turned.transpose(1, 2), kept}, 2).reshape({b, s, heads * d});
      };
      expect_match(fused, reference, {x}, seed, dtype,
                   dtype == torch::kDouble ? kFloat64Tol : kFloat32Tol);
    }
  }
}

namespace {

// Blocked attention against the dense grouped attention with its mask.
// q_scale sets the spread of the scores (about q_scale x 1.5 standard deviations).
void check_blocked_attention(int64_t heads, int64_t kv_heads, int64_t s, int64_t window,
                             int64_t block_rows, int64_t key_block, double q_scale = 1.5,
                             int64_t d = 8) {
  SCOPED_TRACE(::testing::Message()
               << "heads " << heads << "/" << kv_heads << " s " << s << " d " << d << " window "
               << window << " blocks " << block_rows << "x" << key_block << " q scale " << q_scale);
  const int64_t b = 2;
  // Laid out as the attention makes them: [b, s, heads, d] viewed as [b, heads, s, d].
  // Values fp32 holds exactly, so the float64 reference sees the fp32 runs' very inputs (with
  // sharp scores, rounding the inputs alone moves the gradients by more than fp32 round-off).
  auto per_head = [&](int64_t h, double scale) {
    return (torch::randn({b, s, h, d}, torch::kDouble) * scale)
        .to(torch::kFloat)
        .to(torch::kDouble)
        .transpose(1, 2);
  };
  torch::Tensor q = per_head(heads, q_scale), k = per_head(kv_heads, 1.5),
                v = per_head(kv_heads, 1.5);
  // The output's gradient arrives laid out as the o projection's input gradient, [b, s, heads,
  // d]: its rows are heads x d apart, as in the model.
  torch::Tensor seed = per_head(heads, 1.0);
  auto blocked = [&](const std::vector<torch::Tensor>& in) {
    return blocked_attention(in[0], in[1], in[2], window, block_rows, key_block);
  };
  auto dense = [&](const std::vector<torch::Tensor>& in) {
    torch::Tensor mask = attention_mask(s, s, 0, window, in[0].options());
    return grouped_attention(in[0], in[1], in[2], mask);
  };
  expect_match(blocked, dense, {q, k, v}, seed, torch::kDouble, kFloat64Tol);
  // fp32 twice: through the tile products (on AVX-512 CPUs) and through the BLAS.
  expect_match(blocked, dense, {q, k, v}, seed, torch::kFloat, kFloat32Tol);
  kernels::set_tile_gemm_enabled(false);
  expect_match(blocked, dense, {q, k, v}, seed, torch::kFloat, kFloat32Tol);
  kernels::set_tile_gemm_enabled(true);
}

}  // namespace

TEST(BlockedAttention, MatchesDenseCausal) {
  torch::manual_seed(5);
  check_blocked_attention(4, 2, 37, 0, 8, 16);    // GQA, several query and key blocks
  check_blocked_attention(4, 4, 37, 0, 64, 512);  // one block covering the whole sequence
  check_blocked_attention(6, 1, 33, 0, 5, 3);     // multi-query, key blocks smaller than rows
  check_blocked_attention(4, 2, 100, 0, 24, 64);  // key tiles on 32-column panels
  // Head dimension 48: K^T and V^T packed by 16 x 16 transposes, dQ, dK and dV rows of whole
  // 64-byte lines written by streaming stores (on AVX-512 CPUs).
  check_blocked_attention(4, 2, 100, 0, 24, 64, 1.5, 48);
}

TEST(BlockedAttention, MatchesDenseSlidingWindow) {
  torch::manual_seed(6);
  check_blocked_attention(4, 2, 37, 5, 8, 4);      // window shorter than a query block
  check_blocked_attention(4, 2, 37, 12, 8, 16);    // window spanning blocks
  check_blocked_attention(2, 2, 20, 1, 7, 3);      // each query sees only itself
  check_blocked_attention(4, 2, 100, 45, 24, 32);  // window starts rounded down to a panel
}

TEST(BlockedAttention, SharpScoresStayFinite) {
  // Scores spread over hundreds: the softmax's shift must be each row's true maximum over
  // every visible key of the tile (a shift short of it by more than 88 overflows fp32's exp),
  // including the keys past the last full vector and those of a window's first tile.
  torch::manual_seed(8);
  check_blocked_attention(4, 2, 100, 0, 24, 64, 60.0);
  check_blocked_attention(4, 2, 100, 45, 24, 32, 60.0);
  check_blocked_attention(2, 2, 37, 0, 8, 13, 60.0);
}

TEST(BlockedAttention, NeverHoldsASequenceSquaredTensor) {
  // Measured with the tracking allocator: what forward leaves alive for backward (beyond
  // q, k, v themselves) is the output and one log-sum-exp per query row, and the peak inside
  // forward and backward stays far below one dense [s, s] score matrix per head. The dense
  // attention, measured the same way, keeps its softmax: the measurement can tell them apart.
  retort::engine::MemoryTracker& tracker = retort::engine::MemoryTracker::install();
  const int64_t b = 1, heads = 2, d = 16, s = 1024, block_rows = 64;
  const int64_t scores_bytes = b * heads * s * s * int64_t(sizeof(float));
  const int64_t output_bytes = b * heads * s * d * int64_t(sizeof(float));
  const int64_t lse_bytes = b * heads * s * int64_t(sizeof(float));
  auto measure = [&](bool blocked, int64_t& kept, int64_t& peak) {
    torch::manual_seed(7);
    torch::Tensor q = torch::randn({b, heads, s, d}).requires_grad_(true);
    torch::Tensor k = torch::randn({b, heads, s, d}).requires_grad_(true);
    torch::Tensor v = torch::randn({b, heads, s, d}).requires_grad_(true);
    torch::Tensor seed = torch::randn({b, heads, s, d});
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    torch::Tensor out = blocked
                            ? blocked_attention(q, k, v, 0, block_rows)
                            : grouped_attention(q, k, v, attention_mask(s, s, 0, 0, q.options()));
    kept = tracker.current_bytes() - before;
    out.backward(seed);
    peak = tracker.peak_bytes() - before;
  };
  int64_t blocked_kept = 0, blocked_peak = 0, dense_kept = 0, dense_peak = 0;
  measure(true, blocked_kept, blocked_peak);
  measure(false, dense_kept, dense_peak);
  EXPECT_LE(blocked_kept, output_bytes + lse_bytes);
  EXPECT_LT(blocked_peak, scores_bytes / 4);
  EXPECT_GE(dense_kept, scores_bytes);
}

// The fused LM head's cross-entropy alone on the vocabulary runs one loop per row
// (kernels::cross_entropy_rows): against F::cross_entropy on materialised float64 logits,
// with a vocabulary of several of the loop's 512-entry sum blocks and a partial one, padded
// weight rows (which must get no gradient), an ignored target and chunks that split the tokens
// unevenly: the loss and the gradients of the input and the weight.
TEST(FusedKernels, HeadCrossEntropyMatchesMaterialisedLogits) {
  torch::manual_seed(21);
  const int64_t tokens = 37, hidden = 16, vocab = 1100, padded = 1120;
  torch::Tensor x = torch::randn({tokens, hidden}, torch::kDouble);
  torch::Tensor weight = torch::randn({padded, hidden}, torch::kDouble) * 0.7;
  torch::Tensor targets = torch::randint(vocab, {tokens}, torch::kLong);
  const int64_t kIgnoreIndex = -100;  // the LM loss's ignored target (layers/model.h)
  targets[5] = kIgnoreIndex;
  auto fused = [&](const std::vector<torch::Tensor>& in) {
    return fused_head_cross_entropy_sum(in[0], in[1], targets, vocab, TensorParallel{},
                                        /*chunk_tokens=*/8);
  };
  auto reference = [&](const std::vector<torch::Tensor>& in) {
    torch::Tensor logits = torch::matmul(in[0], in[1].t()).narrow(1, 0, vocab);
    return torch::nn::functional::cross_entropy(logits, targets,
                                                torch::nn::functional::CrossEntropyFuncOptions()
                                                    .reduction(torch::kSum)
                                                    .ignore_index(kIgnoreIndex));
  };
  torch::Tensor seed = torch::tensor(0.75, torch::kDouble);
  expect_match(fused, reference, {x, weight}, seed, torch::kDouble, kFloat64Tol);
  expect_match(fused, reference, {x, weight}, seed, torch::kFloat, kFloat32Tol);
  Outcome got = run(fused, {x.to(torch::kFloat), weight.to(torch::kFloat)}, seed.to(torch::kFloat));
  EXPECT_EQ(got.grads[1].narrow(0, vocab, padded - vocab).abs().max().item<double>(), 0.0);
}

// bfloat16 input and weight: the LM head's softmax, log-sum-exp and loss sum are taken in
// float32, only the two products in bfloat16 (both head forms: the fused head and the
// cross-entropy of given logits). The reference is float64 on the logits the bf16 product
// gives (float32 sums rounded once to bf16). Tolerances, u = 2^-8 (bf16's unit round-off):
// - the loss: float32 arithmetic on those logits, with a product entry that rounds the other
//   way now and then (each moves one token's loss by at most u |z| < 0.03): 1e-4 of the total.
//   A softmax or sum kept in bf16 misses by about u / 2 per token, near 1e-3 of the total.
// - the gradients: dz = softmax - onehot rounded to bf16, then a bf16 product: each entry
//   within u (|dz| @ |w|) + u |g| <= 2u (|dz| @ |w|). The fused head sums the weight's
//   gradient over chunks of tokens in float32 (each chunk's product rounded once), and autograd
//   rounds that sum to the bf16 weight's type once more: 3u for the weight. Summed in bf16
//   over the chunks instead, each addition would round again.
TEST(FusedKernels, HeadCrossEntropyInBFloat16SumsInFloat32) {
  torch::manual_seed(23);
  const int64_t tokens = 300, hidden = 64, vocab = 1000, padded = 1024;
  const int64_t kIgnoreIndex = -100;
  torch::Tensor x = torch::randn({tokens, hidden}).to(torch::kBFloat16);
  torch::Tensor weight = (torch::randn({padded, hidden}) * 0.3).to(torch::kBFloat16);
  torch::Tensor targets = torch::randint(vocab, {tokens}, torch::kLong);
  targets[7] = kIgnoreIndex;
  const double u = std::ldexp(1.0, -8);
  for (bool fused : {true, false}) {
    torch::Tensor xs = x.clone().requires_grad_(true), ws = weight.clone().requires_grad_(true);
    torch::Tensor loss =
        fused ? fused_head_cross_entropy_sum(xs, ws, targets, vocab, TensorParallel{}, 64)
              : vocab_parallel_cross_entropy(torch::matmul(xs, ws.t()), targets, vocab,
                                             TensorParallel{})
                    .sum();
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    loss.backward();
    EXPECT_EQ(xs.grad().scalar_type(), torch::kBFloat16);

    torch::Tensor w64 = weight.to(torch::kDouble), x64 = x.to(torch::kDouble);
    torch::Tensor z = torch::matmul(x, weight.t()).to(torch::kDouble).narrow(1, 0, vocab);
    torch::Tensor keep = targets.ne(kIgnoreIndex);
    torch::Tensor safe_targets = torch::where(keep, targets, torch::zeros_like(targets));
    torch::Tensor log_p = torch::log_softmax(z, -1);
    torch::Tensor ref_loss =
        -(log_p.gather(1, safe_targets.unsqueeze(1)).squeeze(1) * keep.to(torch::kDouble)).sum();
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-4 * ref_loss.item<double>())
        << (fused ? "fused head" : "given logits");
    torch::Tensor dz = log_p.exp() - torch::one_hot(safe_targets, vocab).to(torch::kDouble);
    dz = dz * keep.to(torch::kDouble).unsqueeze(1);
    torch::Tensor abs_w = w64.narrow(0, 0, vocab).abs();
    torch::Tensor ref_gx = torch::matmul(dz, w64.narrow(0, 0, vocab));
    torch::Tensor bound_gx = 2 * u * torch::matmul(dz.abs(), abs_w) + 1e-6;
    EXPECT_TRUE(((xs.grad().to(torch::kDouble) - ref_gx).abs() <= bound_gx).all().item<bool>())
        << (fused ? "fused head" : "given logits");
    torch::Tensor ref_gw = torch::matmul(dz.t(), x64);
    torch::Tensor bound_gw = 3 * u * torch::matmul(dz.abs().t(), x64.abs()) + 1e-6;
    torch::Tensor gw = ws.grad().to(torch::kDouble);
    EXPECT_TRUE(((gw.narrow(0, 0, vocab) - ref_gw).abs() <= bound_gw).all().item<bool>())
        << (fused ? "fused head" : "given logits");
    EXPECT_EQ(gw.narrow(0, vocab, padded - vocab).abs().max().item<double>(), 0.0);
  }
}

// The head's loops on bf16 logits (kernels::cross_entropy_rows, softmax_gradient_rows) compute
// in float32 and round the gradient once: bit for bit the float32 loops on the widened logits,
// the gradient then rounded to bf16 (torch's round to nearest even). Rows of 1100 columns (two
// whole 512-entry sum blocks and a partial one, a partial 16-lane vector), 20 of them padding,
// a row without a target, and a target in the row's last real column.
TEST(FusedKernels, HeadLoopsOnBFloat16LogitsAreTheFloat32LoopsRounded) {
  torch::manual_seed(29);
  const int64_t rows = 9, cols = 1100, real = 1080;
  torch::Tensor logits = (torch::randn({rows, cols}) * 4).to(torch::kBFloat16);
  torch::Tensor target = torch::randint(real, {rows}, torch::kLong);
  target[2] = -1;
  target[5] = real - 1;
  torch::Tensor scale = torch::rand({rows}) + 0.5;
  for (bool with_scale : {true, false}) {
    torch::Tensor z16 = logits.clone(), z32 = logits.to(torch::kFloat);
    torch::Tensor m16 = torch::empty({rows}), s16 = torch::empty({rows}),
                  l16 = torch::empty({rows});
    torch::Tensor m32 = torch::empty({rows}), s32 = torch::empty({rows}),
                  l32 = torch::empty({rows});
    const float* scale_ptr = with_scale ? scale.data_ptr<float>() : nullptr;
    retort::kernels::cross_entropy_rows(
        reinterpret_cast<retort::kernels::Bf16*>(z16.data_ptr<at::BFloat16>()), rows, cols, real,
        cols, target.data_ptr<int64_t>(), m16.data_ptr<float>(), s16.data_ptr<float>(),
        l16.data_ptr<float>(), scale_ptr);
    retort::kernels::cross_entropy_rows(z32.data_ptr<float>(), rows, cols, real, cols,
                                        target.data_ptr<int64_t>(), m32.data_ptr<float>(),
                                        s32.data_ptr<float>(), l32.data_ptr<float>(), scale_ptr);
    EXPECT_TRUE(torch::equal(m16, m32));
    EXPECT_TRUE(torch::equal(s16, s32));
    EXPECT_TRUE(torch::equal(l16, l32));
    if (with_scale) {
      EXPECT_TRUE(torch::equal(z16, z32.to(torch::kBFloat16)));
    } else {
      EXPECT_TRUE(torch::equal(z16, logits));  // bf16 logits are left as they were
    }
    if (!with_scale) continue;
    // Formed again from the saved max and sum, as the streamed head's backward does.
    torch::Tensor again = logits.clone();
    retort::kernels::softmax_gradient_rows(
        reinterpret_cast<retort::kernels::Bf16*>(again.data_ptr<at::BFloat16>()), rows, cols, real,
        cols, m16.data_ptr<float>(), s16.data_ptr<float>(), scale.data_ptr<float>(),
        target.data_ptr<int64_t>());
    EXPECT_TRUE(torch::equal(again, z16));
  }
}

// Logits spread over hundreds, each token's largest in the vocabulary's last columns (past the
// last whole 16-lane block of 1100): the softmax is taken relative to the row maximum, so a
// maximum that missed those columns would overflow exp to inf and the loss to NaN.
TEST(FusedKernels, HeadCrossEntropyWithSharpLogitsPeakingLastStaysExact) {
  torch::manual_seed(22);
  const int64_t tokens = 19, hidden = 16, vocab = 1100, padded = 1120, peak = 1098;
  torch::Tensor x = torch::randn({tokens, hidden}, torch::kDouble);
  x.select(1, 0).fill_(1.0);  // a constant feature: weight column 0 adds the same to every token
  torch::Tensor weight = torch::randn({padded, hidden}, torch::kDouble) * 0.7;
  weight.select(1, 0).zero_();
  weight[peak][0] = 400.0;
  torch::Tensor targets = torch::randint(vocab, {tokens}, torch::kLong);
  auto fused = [&](const std::vector<torch::Tensor>& in) {
    return fused_head_cross_entropy_sum(in[0], in[1], targets, vocab, TensorParallel{},
                                        /*chunk_tokens=*/8);
  };
  auto reference = [&](const std::vector<torch::Tensor>& in) {
    torch::Tensor logits = torch::matmul(in[0], in[1].t()).narrow(1, 0, vocab);
    return torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  };
  const torch::Tensor logits = torch::matmul(x, weight.t()).narrow(1, 0, vocab);
  ASSERT_TRUE(logits.argmax(1).eq(peak).all().item<bool>());
  ASSERT_GT((logits.select(1, peak) - logits.narrow(1, 0, peak).amax(1)).min().item<double>(), 300);
  expect_match(fused, reference, {x, weight}, torch::tensor(0.75, torch::kDouble), torch::kFloat,
               kFloat32Tol);
}

// The packed q|k|v and gate|up products read their weights in place once place_adjacent has
// put them in one buffer: no stacked copy (the view's first element is the first weight's),
// values, names and requires_grad unchanged, and the product and its gradients those of the
// separate layers, computed here from copies of the weights in float64.
TEST(PackedLinear, AdjacentWeightsAreReadInPlace) {
  ParameterStore store(5, torch::kFloat);
  const TensorParallel tp;
  ColumnParallelLinear a({"a", 16, 24}, store, tp), b({"b", 16, 8}, store, tp),
      c({"c", 16, 8}, store, tp);
  std::vector<torch::Tensor> before;
  for (const char* name : {"a.weight", "b.weight", "c.weight"})
    before.push_back(store.find(name)->value.detach().clone());
  place_adjacent({&a, &b, &c});

  const torch::Tensor wa = a.weight(), wb = b.weight(), wc = c.weight();
  EXPECT_EQ(store.find("b.weight")->value.data_ptr(), wb.data_ptr());
  EXPECT_TRUE(wb.requires_grad());
  EXPECT_TRUE(torch::equal(wb, before[1]));
  const torch::Tensor stacked = stacked_rows({wa, wb, wc});
  EXPECT_EQ(stacked.data_ptr(), wa.data_ptr()) << "the stacked weights were copied";
  EXPECT_TRUE(torch::equal(stacked, torch::cat(before)));
  // Not adjacent in the order asked: a copy, with the right values.
  EXPECT_TRUE(torch::equal(stacked_rows({wb, wa}), torch::cat({before[1], before[0]})));

  const torch::Tensor x = torch::randn({2, 5, 16}).requires_grad_(true);
  const torch::Tensor dy = torch::randn({2, 5, 40});
  const torch::Tensor y = packed_column_forward({&a, &b, &c}, x);
  y.backward(dy);
  const torch::Tensor x64 = x.detach().to(torch::kDouble).reshape({10, 16});
  const torch::Tensor dy64 = dy.to(torch::kDouble).reshape({10, 40});
  const torch::Tensor w64 = torch::cat(before).to(torch::kDouble);
  const double tol = 1e-5;
  EXPECT_TRUE(
      torch::allclose(y.to(torch::kDouble).reshape({10, 40}), x64.matmul(w64.t()), tol, tol));
  EXPECT_TRUE(
      torch::allclose(x.grad().to(torch::kDouble).reshape({10, 16}), dy64.matmul(w64), tol, tol));
  const torch::Tensor dw64 = dy64.t().matmul(x64);
  EXPECT_TRUE(torch::allclose(wa.grad().to(torch::kDouble), dw64.narrow(0, 0, 24), tol, tol));
  EXPECT_TRUE(torch::allclose(wb.grad().to(torch::kDouble), dw64.narrow(0, 24, 8), tol, tol));
  EXPECT_TRUE(torch::allclose(wc.grad().to(torch::kDouble), dw64.narrow(0, 32, 8), tol, tol));
}

// Every layer of a model built the usual way (one rank) has its q|k|v and gate|up weights
// adjacent, so the fused step never stacks a copy of them.
TEST(PackedLinear, ModelLayersHaveAdjacentPackedWeights) {
  ModelConfig config;
  config.vocab_size = 300;
  config.hidden = 32;
  config.heads = 4;
  config.kv_heads = 2;
  config.ffn_hidden = 48;
  config.layers = 2;
  ParameterStore store(3, torch::kFloat);
  LlamaModel model(config, store);
  for (int64_t layer = 0; layer < config.layers; ++layer)
    for (const std::vector<std::string>& group :
         {std::vector<std::string>{"attn.q_proj", "attn.k_proj", "attn.v_proj"},
          std::vector<std::string>{"mlp.gate_proj", "mlp.up_proj"}}) {
      std::vector<torch::Tensor> weights;
      for (const std::string& part : group)
        weights.push_back(store.find(capture_name(layer, part + ".weight"))->value);
      EXPECT_EQ(stacked_rows(weights).data_ptr(), weights[0].data_ptr())
          << "layer " << layer << " " << group[0];
    }
}
