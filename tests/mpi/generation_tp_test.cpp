// tests/mpi/generation_tp_test.cpp: generation split over 2 TP ranks (vocabulary padded and
// split, heads split, logits gathered, TP rank 0's choice broadcast) gives the logits and the
// sampled tokens of the same model on one rank, in float64, with the KV cache and without; and
// each transformers variant (tests/hf/make_hf_transformers.py), split over the 2 ranks, continues
// its prompt greedily with the tokens transformers' generate() gives.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "../unit/generation_test.h"
#include "engine/generate/generator.h"
#include "parallel/mesh.h"
#include "tests/support/shared_scratch_dir.h"
#include "tests/support/transformers_reference.h"
#include "trainer_test_support.h"

using namespace retort;

TEST(GenerationTp, TwoRanksGenerateWhatOneRankDoes) {
  if (test::world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  parallel::Layout layout;
  layout.tensor = 2;
  layout.data = 1;
  parallel::Mesh mesh(layout);
  layers::TensorParallel tp;
  tp.group = &mesh.tp();
  test::GenerationModel split = test::generation_model(tp), whole = test::generation_model();
  const std::vector<int64_t> prompt = {5, 17, 250, 3, 99, 42};
  {
    torch::NoGradGuard no_grad;
    layers::KvCache split_cache, whole_cache;
    split_cache.capacity = whole_cache.capacity = 6;
    const torch::Tensor tokens = torch::tensor(prompt, torch::kLong).view({1, -1});
    torch::Tensor gathered =
        mesh.tp().all_gather(split.model->forward_cached(tokens, split_cache), 2);
    const torch::Tensor reference = whole.model->forward_cached(tokens, whole_cache);
    EXPECT_LT(
        (gathered.narrow(-1, 0, 300) - reference.narrow(-1, 0, 300)).abs().max().item<double>(),
        1e-10);
  }
  for (bool cache : {true, false}) {
    engine::SamplingOptions options;
    options.max_tokens = 32;
    options.temperature = 0.9;
    options.top_k = 30;
    options.seed = 5;
    EXPECT_EQ(engine::generate(*split.model, prompt, options, cache),
              engine::generate(*whole.model, prompt, options, cache))
        << (cache ? "with" : "without") << " the KV cache";
  }
}

TEST(GenerationTp, GreedyTokensEqualTransformersGenerateOnTwoRanks) {
  if (test::world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  parallel::Layout layout;
  layout.tensor = 2;
  layout.data = 1;
  parallel::Mesh mesh(layout);
  const std::filesystem::path root = retort::testing::shared_scratch_dir("generation_tp_hf");
  for (const char* variant : retort::testing::kTransformersVariants) {
    SCOPED_TRACE(variant);
    const std::string dir = (root / variant).string();
    int made = 1;  // rank 0 makes the reference; both ranks stop if it could not
    if (mesh.world_rank() == 0) try {
        retort::testing::make_transformers_reference(dir, variant);
      } catch (const std::exception& e) {
        made = 0;
        ADD_FAILURE() << e.what();
      }
    MPI_Bcast(&made, 1, MPI_INT, 0, MPI_COMM_WORLD);
    ASSERT_EQ(made, 1);
    const engine::InferenceModel m = engine::load_inference_model(dir, mesh);
    ASSERT_EQ(m.store->tp().size, 2);
    const retort::testing::GreedyContinuations tokens =
        retort::testing::greedy_continuations(*m.model, dir);
    EXPECT_EQ(tokens.ours, tokens.transformers);
  }
}
