// tests/mpi/teacher_top_k_test.cpp: the entries a teacher cache stores (distill/teacher_top_k.h)
// under TP1 and TP<world>, in float64, against the whole vocabulary's log-softmax on one rank:
// the k largest log-probabilities and their ids, and the log of the mass outside them (k = 1,
// 7, all 150 ids, where the tail is empty), at temperature 2, with the padding columns of the
// split (150 ids in 256 columns) holding large values that must not count.
#include "distill/teacher_top_k.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallel/communicator.h"
#include "world_group.h"

using namespace retort;

TEST(TeacherTopK, EntriesMatchTheWholeVocabularyOnOneRank) {
  parallel::Communicator comm(dup_world(), "tp");
  const int64_t vocab = 150, padded = layers::padded_vocab_size(vocab, comm.size());
  torch::manual_seed(3);
  const torch::Tensor whole = torch::randn({7, vocab}, torch::kDouble) * 3;
  // The padded logits, padding set high so that counting it would show.
  torch::Tensor padded_logits = torch::full({7, padded}, 50.0, torch::kDouble);
  padded_logits.narrow(1, 0, vocab).copy_(whole);
  const double temperature = 2.0;
  const torch::Tensor log_p = torch::log_softmax(whole / temperature, 1);
  for (int64_t k : {int64_t(1), int64_t(7), vocab}) {
    auto [want_values, want_ids] = log_p.topk(k, 1);
    const torch::Tensor rest = log_p.scatter(1, want_ids, -INFINITY);
    const torch::Tensor want_tail = torch::logsumexp(rest, 1);
    for (int tp_size : {1, comm.size()}) {
      SCOPED_TRACE("k " + std::to_string(k) + ", TP" + std::to_string(tp_size));
      layers::TensorParallel tp;
      if (tp_size > 1) tp.group = &comm;
      const int64_t local = padded / tp_size;
      const torch::Tensor mine = padded_logits.narrow(1, tp.rank() * local, local).contiguous();
      const distill::TeacherTopK got = distill::teacher_top_k(mine, vocab, k, temperature, tp);
      EXPECT_TRUE(torch::equal(got.ids, want_ids));
      EXPECT_LT((got.log_probs - want_values).abs().max().item<double>(), 1e-12);
      if (k == vocab) {
        EXPECT_TRUE(torch::all(got.tail_log_mass == -INFINITY).item<bool>());
      } else {
        EXPECT_LT((got.tail_log_mass - want_tail).abs().max().item<double>(), 1e-12);
      }
    }
  }
}
