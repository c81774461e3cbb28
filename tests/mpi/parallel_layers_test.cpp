// tests/mpi/parallel_layers_test.cpp: each tensor-parallel layer against the plain
// (one-rank) layer built from the same specs and seed, in double precision: outputs, input
// gradients and every weight gradient (gathered to global shape), under TP and under
// sequence-tensor parallelism, with the world as the TP group (2 or 4 ranks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/optim/grad_sync.h"
#include "layers/block.h"
#include "layers/model.h"
#include "layers/sharding.h"
#include "layers/vocab_parallel.h"
#include "parallel/primitives.h"
#include "world_group.h"

using namespace retort;
using namespace retort::layers;

namespace {

struct TpGroup {
  parallel::Communicator comm{dup_world(), "tp"};
  TensorParallel plain{};
  TensorParallel tp(bool sequence) { return TensorParallel{&comm, sequence}; }
};

torch::Tensor shared_random(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kDouble);
}

ModelConfig config_for(int tp_size) {
  ModelConfig c;
  c.vocab_size = 200;  // padded to 256 (TP2) or 512 (TP4): padding must never count
  c.hidden = 32;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 2;  // TP4: kv heads replicated
  c.ffn_hidden = 16 * tp_size;
  c.layer_windows = {0, 5};
  c.qkv_bias = true;
  c.init_std = 0.2;
  return c;
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_TRUE(torch::allclose(a, b, 1e-9, 1e-11))
      << what << ": max diff " << (a - b).abs().max().item<double>();
}

// Every gradient of the parallel store, made whole and gathered, equals the plain one.
void expect_same_gradients(ParameterStore& parallel, ParameterStore& plain,
                           const TensorParallel& tp) {
  engine::sum_partial_tp_grads(parallel, tp);
  int compared = 0;
  for (auto& p : parallel.all()) {
    const Parameter* q = plain.find(p.spec.name);
    ASSERT_NE(q, nullptr) << p.spec.name;
    ASSERT_TRUE(p.value.grad().defined()) << p.spec.name;
    torch::Tensor expected = q->value.grad();
    if (q->spec.padded_rows > 0) expected = expected.narrow(0, 0, q->spec.shape[0]);
    expect_close(layers::to_global(p.value.grad(), p.spec, tp), expected, p.spec.name);
    ++compared;
  }
  EXPECT_EQ(compared, int(plain.all().size()));
}

torch::Tensor seq_chunk(const torch::Tensor& t, const parallel::Communicator& c) {
  return parallel::split_along(t, 1, c).contiguous();
}

}  // namespace

TEST(ParallelLayers, ColumnAndRowLinear) {
  for (bool sequence : {false, true}) {
    TpGroup s;
    const int n = s.comm.size();
    TensorParallel tp = s.tp(sequence);
    ParameterStore ps(3, torch::kDouble, tp.position()), qs(3, torch::kDouble);
    LinearSpec col{"col", 12, 8 * n, 0.3, true}, row{"row", 8 * n, 12, 0.3, true};
    ColumnParallelLinear pc(col, ps, tp), qc(col, qs, s.plain);
    RowParallelLinear pr(row, ps, tp), qr(row, qs, s.plain);
    {  // Biases start at zero; give them values so one added per rank (or never) shows.
      torch::NoGradGuard no_grad;
      torch::Tensor bias = shared_random({12}, 4);
      ps.find("row.bias")->value.copy_(bias);
      qs.find("row.bias")->value.copy_(bias);
    }
    torch::Tensor X = shared_random({2, 4 * n, 12}, 1), G = shared_random({2, 4 * n, 12}, 2);
    // Plain: x -> column -> tanh -> row.
    torch::Tensor xq = X.clone().requires_grad_(true);
    torch::Tensor yq = qr.forward(torch::tanh(qc.forward(xq)));
    yq.backward(G);
    // Parallel: the residual input is sequence-split under STP.
    torch::Tensor xp = (sequence ? seq_chunk(X, s.comm) : X.clone()).requires_grad_(true);
    torch::Tensor yp = pr.forward(torch::tanh(pc.forward(tp.enter_column(xp))));
    yp.backward(sequence ? seq_chunk(G, s.comm) : G);
    expect_close(yp, sequence ? seq_chunk(yq, s.comm) : yq.detach(), "output");
    expect_close(xp.grad(), sequence ? seq_chunk(xq.grad(), s.comm) : xq.grad(), "input grad");
    expect_same_gradients(ps, qs, tp);
  }
}

TEST(ParallelLayers, VocabParallelEmbedding) {
  for (bool sequence : {false, true}) {
    TpGroup s;
    TensorParallel tp = s.tp(sequence);
    ParamSpec spec{"embed.weight", {200, 16}, 0};
    spec.init_std = 1.0;
    spec.padded_rows = padded_vocab_size(200, s.comm.size());
    ParamSpec plain_spec = spec;
    plain_spec.padded_rows = 0;
    ParameterStore ps(5, torch::kDouble, tp.position()), qs(5, torch::kDouble);
    torch::Tensor wp = ps.create(spec), wq = qs.create(plain_spec);
    torch::manual_seed(9);
    torch::Tensor tokens = torch::randint(200, {2, 4 * s.comm.size()}, torch::kLong);
    torch::Tensor G = shared_random({2, 4 * s.comm.size(), 16}, 10);
    torch::Tensor yq = torch::embedding(wq, tokens);
    yq.backward(G);
    torch::Tensor yp = vocab_parallel_embedding(tokens, wp, tp);
    yp.backward(sequence ? seq_chunk(G, s.comm) : G);
    expect_close(yp, sequence ? seq_chunk(yq, s.comm) : yq.detach(), "embedding output");
    expect_close(layers::to_global(wp.grad(), spec, tp), wq.grad(), "embedding weight grad");
  }
}

TEST(ParallelLayers, VocabParallelCrossEntropyMatchesTorch) {
  TpGroup s;
  TensorParallel tp = s.tp(false);
  const int64_t vocab = 200, padded = padded_vocab_size(vocab, s.comm.size());
  torch::Tensor logits = shared_random({3, 5, padded}, 11) * 3;
  torch::manual_seed(12);
  torch::Tensor targets = torch::randint(vocab, {3, 5}, torch::kLong);
  targets[0][1] = kIgnoreIndex;
  targets[2][4] = kIgnoreIndex;
  torch::Tensor G = shared_random({3, 5}, 13);
  // Reference: torch's cross-entropy on the real vocabulary only.
  torch::Tensor lq = logits.narrow(-1, 0, vocab).clone().requires_grad_(true);
  namespace F = torch::nn::functional;
  torch::Tensor ref = F::cross_entropy(
      lq.reshape({-1, vocab}), targets.reshape({-1}),
      F::CrossEntropyFuncOptions().reduction(torch::kNone).ignore_index(kIgnoreIndex));
  ref.backward(G.reshape({-1}));
  torch::Tensor lp = parallel::split_along(logits, 2, s.comm).contiguous().requires_grad_(true);
  torch::Tensor loss = vocab_parallel_cross_entropy(lp, targets, vocab, tp);
  loss.backward(G);
  expect_close(loss.reshape({-1}), ref.detach(), "per-token loss");
  torch::Tensor full_grad = s.comm.all_gather(lp.grad(), 2);
  expect_close(full_grad.narrow(-1, 0, vocab), lq.grad(), "logit gradient");
  EXPECT_EQ(full_grad.narrow(-1, vocab, padded - vocab).abs().max().item<double>(), 0.0);
}

TEST(ParallelLayers, AttentionMlpBlock) {
  for (bool sequence : {false, true}) {
    TpGroup s;
    const int n = s.comm.size();
    TensorParallel tp = s.tp(sequence);
    ModelConfig c = config_for(n);
    ParameterStore ps(21, torch::kDouble, tp.position()), qs(21, torch::kDouble);
    Block pb(c, 1, ps, tp), qb(c, 1, qs, s.plain);  // layer 1: sliding window 5
    {                                               // Non-trivial norms and biases.
      torch::NoGradGuard g;
      for (auto* st : {&ps, &qs})
        for (auto& p : st->all())
          if (p.value.dim() == 1) {
            torch::manual_seed(std::hash<std::string>()(p.spec.name) % 1000);
            torch::Tensor global = torch::randn(p.spec.shape, torch::kDouble);
            p.value.copy_(layers::from_global(global, p.spec, st == &ps ? tp : s.plain, p.value));
          }
    }
    const int64_t seq = 4 * n;
    BlockContext ctx = make_block_context(c, seq, torch::TensorOptions().dtype(torch::kDouble));
    torch::Tensor X = shared_random({2, seq, c.hidden}, 22),
                  G = shared_random({2, seq, c.hidden}, 23);
    CaptureSink qsink({capture_name(1, "mixer_output"), capture_name(1, "mlp_output")});
    CaptureSink psink = qsink;
    torch::Tensor xq = X.clone().requires_grad_(true);
    torch::Tensor yq = qb.forward(xq, ctx, &qsink);
    yq.backward(G);
    torch::Tensor xp = (sequence ? seq_chunk(X, s.comm) : X.clone()).requires_grad_(true);
    torch::Tensor yp = pb.forward(xp, ctx, &psink);
    yp.backward(sequence ? seq_chunk(G, s.comm) : G);
    auto local = [&](const torch::Tensor& t) {
      return sequence ? seq_chunk(t.detach(), s.comm) : t.detach();
    };
    expect_close(yp, local(yq), "block output");
    for (const char* point : {"mixer_output", "mlp_output"})
      expect_close(psink.at(capture_name(1, point)), local(qsink.at(capture_name(1, point))),
                   point);
    expect_close(xp.grad(), local(xq.grad()), "block input grad");
    expect_same_gradients(ps, qs, tp);
  }
}

TEST(ParallelLayers, WholeModelLossAndGradients) {
  for (bool sequence : {false, true}) {
    for (bool tied : {false, true}) {
      TpGroup s;
      TensorParallel tp = s.tp(sequence);
      ModelConfig c = config_for(s.comm.size());
      c.tied_embeddings = tied;
      ParameterStore ps(31, torch::kDouble, tp.position()), qs(31, torch::kDouble);
      LlamaModel pm(c, ps, tp), qm(c, qs);
      torch::manual_seed(32);
      torch::Tensor tokens = torch::randint(c.vocab_size, {2, 4 * s.comm.size()}, torch::kLong);
      torch::Tensor targets = torch::randint(c.vocab_size, {2, 4 * s.comm.size()}, torch::kLong);
      targets[1][2] = kIgnoreIndex;
      torch::Tensor lq = qm.loss_sum(tokens, targets), lp = pm.loss_sum(tokens, targets);
      lq.backward();
      lp.backward();
      EXPECT_NEAR(lp.item<double>(), lq.item<double>(), 1e-10 * std::abs(lq.item<double>()));
      expect_same_gradients(ps, qs, tp);
    }
  }
}
