// tests/unit/model_reference_test.cpp: the model's forward pass and loss against an
// independent reference written here with plain torch ops in double precision: per-head
// attention loops, RoPE from its pairwise rotation formula, explicit mask loops, RMSNorm,
// SwiGLU and log-softmax cross-entropy. Also checks the capture points.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "layers/model.h"

using namespace retort::layers;

namespace {

torch::Tensor param(const ParameterStore& store, const std::string& name) {
  const Parameter* p = store.find(name);
  EXPECT_NE(p, nullptr) << name;
  return p->value.detach();
}

torch::Tensor ref_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x / torch::sqrt(x.pow(2).mean(-1, true) + eps) * w;
}

// Rotates pairs (i, i + d/2) by angle pos * theta^(-2i/d), the HF rotate-half convention.
torch::Tensor ref_rope(const torch::Tensor& x, double theta) {  // x [seq, d]
  const int64_t s = x.size(0), d = x.size(1), half = d / 2;
  torch::Tensor out = x.clone();
  for (int64_t p = 0; p < s; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::pow(theta, -2.0 * i / d);
      const double a = x[p][i].item<double>(), b = x[p][i + half].item<double>();
      out[p][i] = a * std::cos(angle) - b * std::sin(angle);
      out[p][i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  return out;
}

torch::Tensor ref_block(const ModelConfig& c, const ParameterStore& st, int64_t layer,
                        const torch::Tensor& x /* [s, h] */,
                        std::map<std::string, torch::Tensor>* captures) {
  const std::string p = "layers." + std::to_string(layer) + ".";
  const int64_t s = x.size(0), d = c.head_dim(), group = c.heads / c.kv_heads;
  const int64_t window = c.window_of_layer(layer);
  torch::Tensor n = ref_rms_norm(x, param(st, p + "attn_norm.weight"), c.norm_eps);
  torch::Tensor q = torch::mm(n, param(st, p + "attn.q_proj.weight").t());
  torch::Tensor k = torch::mm(n, param(st, p + "attn.k_proj.weight").t());
  torch::Tensor v = torch::mm(n, param(st, p + "attn.v_proj.weight").t());
  if (c.qkv_bias) {
    q = q + param(st, p + "attn.q_proj.bias");
    k = k + param(st, p + "attn.k_proj.bias");
    v = v + param(st, p + "attn.v_proj.bias");
  }
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < c.heads; ++h) {
    const int64_t kvh = h / group;  // query head h reads kv head h / group
    torch::Tensor qh = ref_rope(q.narrow(1, h * d, d), c.rope_theta);
    torch::Tensor kh = ref_rope(k.narrow(1, kvh * d, d), c.rope_theta);
    torch::Tensor vh = v.narrow(1, kvh * d, d);
    torch::Tensor scores = torch::mm(qh, kh.t()) / std::sqrt(double(d));
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = 0; j < s; ++j) {
        const bool visible = j <= i && (window == 0 || i - j < window);
        if (!visible) scores[i][j] = -1e300;
      }
    heads.push_back(torch::mm(torch::softmax(scores, 1), vh));
  }
  torch::Tensor mixer = torch::mm(torch::cat(heads, 1), param(st, p + "attn.o_proj.weight").t());
  torch::Tensor h1 = x + mixer;
  torch::Tensor n2 = ref_rms_norm(h1, param(st, p + "mlp_norm.weight"), c.norm_eps);
  torch::Tensor gate = torch::mm(n2, param(st, p + "mlp.gate_proj.weight").t());
  torch::Tensor up = torch::mm(n2, param(st, p + "mlp.up_proj.weight").t());
  torch::Tensor mlp =
      torch::mm(gate * torch::sigmoid(gate) * up, param(st, p + "mlp.down_proj.weight").t());
  (*captures)[p + "mixer_output"] = mixer;
  (*captures)[p + "mlp_output"] = mlp;
  (*captures)[p + "block_output"] = h1 + mlp;
  return h1 + mlp;
}

// Logits of one sequence [s] -> [s, vocab].
torch::Tensor ref_logits(const ModelConfig& c, const ParameterStore& st,
                         const torch::Tensor& tokens,
                         std::map<std::string, torch::Tensor>* captures) {
  torch::Tensor x = param(st, "embed.weight").index_select(0, tokens);
  for (int64_t l = 0; l < c.layers; ++l) x = ref_block(c, st, l, x, captures);
  x = ref_rms_norm(x, param(st, "final_norm.weight"), c.norm_eps);
  const std::string head = c.tied_embeddings ? "embed.weight" : "lm_head.weight";
  return torch::mm(x, param(st, head).narrow(0, 0, c.vocab_size).t());  // drop padding rows
}

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden = 32;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;  // GQA: kv_heads < heads
  c.ffn_hidden = 48;
  c.rope_theta = 500.0;
  c.layer_windows = {0, 3, 5};  // full, then two sliding windows
  c.qkv_bias = true;
  c.init_std = 0.2;  // large weights, so every part of the block matters to the output
  return c;
}

void check_against_reference(const ModelConfig& c, const KernelPolicy& kernels) {
  SCOPED_TRACE(::testing::Message() << "fused " << kernels.fused << ", attention block rows "
                                    << kernels.attention_block_rows);
  ParameterStore store(7, torch::kDouble);
  LlamaModel model(c, store);
  model.set_kernels(kernels);
  {  // Non-trivial norms and biases, so a mistake in how they are applied shows.
    torch::NoGradGuard g;
    for (auto& p : store.all())
      if (p.value.dim() == 1) p.value.add_(torch::randn_like(p.value) * 0.3);
  }
  const int64_t b = 2, s = 9;
  torch::Tensor tokens = torch::randint(c.vocab_size, {b, s}, torch::kLong);
  torch::Tensor targets = torch::randint(c.vocab_size, {b, s}, torch::kLong);
  targets[0][2] = kIgnoreIndex;
  targets[1][5] = kIgnoreIndex;

  CaptureSink sink;
  for (int64_t l = 0; l < c.layers; ++l)
    for (const char* point : kCapturePoints) sink.want(capture_name(l, point));
  torch::Tensor padded_logits = model.forward(tokens, &sink);
  // The vocabulary is padded to a multiple of 128; padded entries are -inf and never count.
  ASSERT_EQ(padded_logits.size(-1), 128);
  EXPECT_TRUE(torch::all(padded_logits.narrow(-1, c.vocab_size, 128 - c.vocab_size) ==
                         -std::numeric_limits<double>::infinity())
                  .item<bool>());
  torch::Tensor logits = padded_logits.narrow(-1, 0, c.vocab_size);
  torch::Tensor loss = model.loss_sum(tokens, targets);

  double ref_loss = 0;
  for (int64_t i = 0; i < b; ++i) {
    std::map<std::string, torch::Tensor> ref_captures;
    torch::Tensor ref = ref_logits(c, store, tokens[i], &ref_captures);
    EXPECT_TRUE(torch::allclose(logits[i], ref, 1e-10, 1e-10)) << "sequence " << i;
    for (const auto& [name, value] : ref_captures)
      EXPECT_TRUE(torch::allclose(sink.at(name)[i], value, 1e-10, 1e-10)) << name;
    torch::Tensor logp = torch::log_softmax(ref, 1);
    for (int64_t j = 0; j < s; ++j) {
      const int64_t t = targets[i][j].item<int64_t>();
      if (t != kIgnoreIndex) ref_loss -= logp[j][t].item<double>();
    }
  }
  EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-9 * std::abs(ref_loss));
  EXPECT_EQ(count_targets(targets), b * s - 2);
}

// The fused kernels with blocked attention in several query blocks (s = 9), with one block,
// and the composed torch ops with dense attention all match the same reference.
void check_against_reference(const ModelConfig& c) {
  for (KernelPolicy kernels :
       {KernelPolicy{true, 4}, KernelPolicy{true, 128}, KernelPolicy{false, 0}})
    check_against_reference(c, kernels);
}

}  // namespace

TEST(ModelReference, GqaSlidingWindowBiasUntiedMatchesReference) {
  check_against_reference(small_config());
}

TEST(ModelReference, TiedEmbeddingsGlobalWindowMatchesReference) {
  ModelConfig c = small_config();
  c.layer_windows.clear();
  c.sliding_window = 4;
  c.tied_embeddings = true;
  c.qkv_bias = false;
  c.kv_heads = 1;  // multi-query attention
  check_against_reference(c);
}

TEST(ModelReference, FullAttentionEqualHeadsMatchesReference) {
  ModelConfig c = small_config();
  c.layer_windows.clear();
  c.kv_heads = c.heads;  // plain multi-head attention
  check_against_reference(c);
}

TEST(ModelReference, SlidingWindowChangesOutputOnlyBeyondWindow) {
  // Positions < window see the same keys with or without the window; later ones differ.
  ModelConfig full = small_config();
  full.layer_windows.clear();
  full.layers = 1;
  ModelConfig windowed = full;
  windowed.sliding_window = 3;
  ParameterStore a(3, torch::kDouble), b(3, torch::kDouble);
  LlamaModel ma(full, a), mb(windowed, b);
  torch::Tensor tokens = torch::randint(full.vocab_size, {1, 8}, torch::kLong);
  torch::Tensor la = ma.forward(tokens).narrow(-1, 0, full.vocab_size);
  torch::Tensor lb = mb.forward(tokens).narrow(-1, 0, full.vocab_size);
  EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 3), lb.narrow(1, 0, 3), 1e-12, 1e-12));
  EXPECT_FALSE(torch::allclose(la.narrow(1, 3, 5), lb.narrow(1, 3, 5), 1e-6, 1e-6));
}
