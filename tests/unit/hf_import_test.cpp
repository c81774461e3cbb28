// tests/unit/hf_import_test.cpp: Hugging Face models in and out against independent
// references, both run by tools/setup.sh's Python (RETORT_PYTHON):
//  - tests/hf/make_hf_transformers.py: transformers' own LlamaForCausalLM (GQA, tied and
//    untied head), MistralForCausalLM (sliding window) and Qwen2ForCausalLM (qkv bias), with
//    random weights, written by save_pretrained, and their own forward's logits. Retort's
//    import must give the same logits (fp32, relative 1e-5); Retort's export must load back
//    into transformers (from_pretrained, through the safetensors library) and give them too;
//    one training step in float64 gives transformers' loss and gradients (relative 1e-10).
//  - tests/hf/make_hf_llama.py: a tiny random model written with its own safetensors writer
//    (json + struct) and the logits of its own plain-torch forward, for what transformers does
//    not write here: an untied head across three shard files and bf16 weights. Export then
//    import gives byte-identical tensors.
// And bf16 mixed precision: a bf16 checkpoint loads into a bf16 store (a teacher's) with no
// float32 copy on the way, by the tracked peak; a student's float32 main weights exported as
// bf16 reload to the logits the student computes in bf16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "engine/generate/generator.h"
#include "engine/hf/hf_export.h"
#include "engine/hf/hf_model.h"
#include "engine/observe/memory_tracker.h"
#include "layers/model.h"
#include "parallel/mesh.h"
#include "tests/support/scratch_dir.h"
#include "tests/support/transformers_reference.h"

namespace fs = std::filesystem;
using namespace retort;

namespace {

// Runs the reference script for a variant into a fresh directory of the running test's own
// (CTest runs the tests of this file in parallel).
fs::path test_dir() {
  return retort::testing::scratch_dir(
      std::string("hf_test_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

std::string make_reference(const std::string& variant) {
  const fs::path dir = test_dir() / variant;
  fs::remove_all(dir);
  const std::string command =
      std::string(RETORT_PYTHON) + " " + RETORT_HF_SCRIPT + " " + dir.string() + " " + variant;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return dir.string();
}

// transformers' own model of a variant, written by save_pretrained, with its references.
std::string make_transformers_reference(const std::string& variant) {
  return retort::testing::make_transformers_reference(test_dir() / ("transformers_" + variant),
                                                      variant);
}

// Whether transformers loads `exported` and gives the logits of the reference in `reference`.
bool transformers_matches(const std::string& exported, const std::string& reference) {
  const std::string command = std::string(RETORT_PYTHON) + " " + RETORT_HF_TRANSFORMERS_SCRIPT +
                              " check " + exported + " " + reference;
  return std::system(command.c_str()) == 0;
}

using retort::testing::kTransformersVariants;
using retort::testing::reference_tensor;

// Retort's forward of the model in `dir` on its reference tokens, against the reference logits.
void expect_logits_match(const std::string& dir, const std::string& what) {
  const layers::ModelConfig config = hf::read_hf_config(dir);
  layers::ParameterStore store(0, torch::kFloat);
  layers::LlamaModel model(config, store);
  hf::load_hf_parameters(dir, config, store, {});
  torch::Tensor tokens = reference_tensor(dir, "tokens", torch::kLong);
  torch::Tensor want = reference_tensor(dir, "logits", torch::kFloat);
  torch::NoGradGuard no_grad;
  torch::Tensor got = model.forward(tokens).narrow(-1, 0, config.vocab_size);
  const double scale = want.abs().max().item<double>();
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-5 * scale) << what;
}

const char* kVariants[] = {"llama_gqa_tied", "llama_untied_sharded", "qwen2_bias", "mistral_window",
                           "llama_bf16"};

}  // namespace

TEST(HfImport, LogitsMatchTransformersForward) {
  for (const char* variant : kTransformersVariants) {
    const std::string dir = make_transformers_reference(variant);
    EXPECT_EQ(hf::read_hf_config(dir).rope_theta, 5000.0) << variant;  // not the default
    expect_logits_match(dir, variant);
  }
}

// Retort's export, sharded, read back by transformers itself: its logits are the reference's.
TEST(HfExport, TransformersLoadsTheExportAndGivesItsOwnLogits) {
  for (const char* variant : kTransformersVariants) {
    const std::string dir = make_transformers_reference(variant);
    const fs::path work = test_dir() / (std::string(variant) + "_out");
    fs::remove_all(work);
    fs::create_directories(work);
    hf::import_hf(dir, (work / "imported").string());
    hf::ExportOptions options;
    options.dtype = hf::StDtype::F32;
    options.shard_bytes = 20000;  // several shards, with an index
    hf::export_hf((work / "imported").string(), (work / "exported").string(), options);
    EXPECT_TRUE(transformers_matches((work / "exported").string(), dir)) << variant;
  }
  // Phi-3's own layout asked for: q, k, v and gate, up joined again, read by Phi3ForCausalLM.
  const std::string phi3 = make_transformers_reference("phi3_layout");
  const fs::path work = test_dir() / "phi3_layout_as_phi3";
  fs::remove_all(work);
  fs::create_directories(work);
  hf::import_hf(phi3, (work / "imported").string());
  hf::ExportOptions options;
  options.model_type = "phi3";
  hf::export_hf((work / "imported").string(), (work / "exported").string(), options);
  const hf::HfWeights original(phi3), exported((work / "exported").string());
  EXPECT_EQ(original.names(), exported.names());
  EXPECT_TRUE(
      torch::equal(original.read("model.layers.1.self_attn.qkv_proj.weight", torch::kFloat),
                   exported.read("model.layers.1.self_attn.qkv_proj.weight", torch::kFloat)));
  EXPECT_TRUE(transformers_matches((work / "exported").string(), phi3));
}

// Greedy generation through the KV cache, past the RoPE scalings' original context, against
// transformers' generate() on the same model and prompt.
TEST(HfGenerate, GreedyTokensEqualTransformersGenerate) {
  std::unique_ptr<parallel::Mesh> mesh = parallel::Mesh::single_process();
  for (const char* variant : kTransformersVariants) {
    const std::string dir = make_transformers_reference(variant);
    const engine::InferenceModel m = engine::load_inference_model(dir, *mesh);
    const retort::testing::GreedyContinuations tokens =
        retort::testing::greedy_continuations(*m.model, dir);
    EXPECT_EQ(tokens.ours, tokens.transformers) << variant;
  }
}

// One training step in float64: the mean next-token cross-entropy and the gradient of every
// parameter, against transformers' own forward and autograd in float64 (its RoPE tables and
// softmax too: the script's Float64Names). Gradients reach Retort's layout through the importer
// (a tied head's two uses summed in one tensor, Phi-3's fused rows split), which is linear.
TEST(HfImport, TrainingStepMatchesTransformersAutogradInFloat64) {
  for (const char* variant : kTransformersVariants) {
    SCOPED_TRACE(variant);
    const std::string dir = make_transformers_reference(variant);
    const layers::ModelConfig config = hf::read_hf_config(dir);
    layers::ParameterStore store(0, torch::kDouble), want(0, torch::kDouble);
    layers::LlamaModel model(config, store), gradient_layout(config, want);
    hf::load_hf_parameters(dir, config, store, {});
    hf::load_hf_parameters((fs::path(dir) / "step_gradients").string(), config, want, {});
    const torch::Tensor tokens = reference_tensor(dir, "tokens", torch::kLong);
    torch::Tensor targets = tokens.roll(-1, 1);
    targets.select(1, tokens.size(1) - 1).fill_(layers::kIgnoreIndex);
    const torch::Tensor loss =
        model.loss_sum(tokens, targets) / double(layers::count_targets(targets));
    loss.backward();
    const double want_loss = reference_tensor(dir, "step_loss", torch::kDouble).item<double>();
    EXPECT_NEAR(loss.item<double>(), want_loss, 1e-10 * std::abs(want_loss));
    ASSERT_EQ(store.all().size(), want.all().size());
    for (const layers::Parameter& p : store.all()) {
      ASSERT_TRUE(p.value.grad().defined()) << p.spec.name;
      const torch::Tensor& expected = want.find(p.spec.name)->value;
      const double scale = expected.abs().max().item<double>();
      EXPECT_GT(scale, 0) << p.spec.name;
      EXPECT_LE((p.value.grad() - expected).abs().max().item<double>(), 1e-10 * scale)
          << p.spec.name;
    }
  }
}

TEST(HfImport, LogitsMatchAnIndependentTorchForward) {
  for (const char* variant : kVariants) expect_logits_match(make_reference(variant), variant);
}

// What the reference checks, seen failing: the window and the bias change the logits, so a
// model that ignored them would not pass above.
TEST(HfImport, WindowAndBiasAreReadFromConfig) {
  const layers::ModelConfig mistral = hf::read_hf_config(make_reference("mistral_window"));
  EXPECT_EQ(mistral.sliding_window, 5);
  EXPECT_EQ(mistral.kv_heads, 1);
  const layers::ModelConfig qwen = hf::read_hf_config(make_reference("qwen2_bias"));
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.tied_embeddings);
  EXPECT_TRUE(hf::read_hf_config(make_reference("llama_gqa_tied")).tied_embeddings);
}

// Mistral-Nemo's layout: heads of their own width (12, where hidden / heads is 8) are read as
// model.head_dim, change the projections' shapes, and are written back on export; the logits
// tests above compare the model built from them with transformers'.
TEST(HfImport, OwnHeadDimIsReadAndWrittenBack) {
  const std::string dir = make_transformers_reference("mistral_head_dim");
  const layers::ModelConfig config = hf::read_hf_config(dir);
  EXPECT_EQ(config.head_dim(), 12);
  EXPECT_EQ(config.explicit_head_dim, 12);
  layers::ParameterStore store(0, torch::kFloat);
  layers::LlamaModel model(config, store);
  EXPECT_EQ(store.find("layers.0.attn.q_proj.weight")->value.sizes().vec(),
            (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(store.find("layers.0.attn.o_proj.weight")->value.sizes().vec(),
            (std::vector<int64_t>{32, 48}));
  EXPECT_NE(hf::hf_config_json(config).find("\"head_dim\": 12"), std::string::npos);
  // Qwen3: per-head query and key norms of head_dim, whole on each rank.
  const layers::ModelConfig qwen3 =
      hf::read_hf_config(make_transformers_reference("qwen3_qk_norm"));
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim(), 12);
  layers::ParameterStore qwen3_store(0, torch::kFloat);
  layers::LlamaModel qwen3_model(qwen3, qwen3_store);
  EXPECT_EQ(qwen3_store.find("layers.1.attn.k_norm.weight")->value.sizes().vec(),
            (std::vector<int64_t>{12}));
  // Where head_dim is hidden / heads, it stays implicit.
  EXPECT_EQ(hf::read_hf_config(make_transformers_reference("qwen2_bias")).explicit_head_dim, 0);
}

TEST(HfImport, ExportThenImportGivesByteIdenticalTensors) {
  for (const char* variant : kVariants) {
    const std::string dir = make_reference(variant);
    const fs::path work = retort::testing::scratch_dir(std::string("hf_test_") + variant + "_out");
    const std::string checkpoint = (work / "imported").string();
    hf::import_hf(dir, checkpoint);
    hf::ExportOptions options;
    options.dtype = std::string(variant) == "llama_bf16" ? hf::StDtype::BF16 : hf::StDtype::F32;
    options.shard_bytes = 20000;  // several shards, with an index
    hf::export_hf(checkpoint, (work / "exported").string(), options);
    EXPECT_TRUE(fs::exists(work / "exported" / "model.safetensors.index.json")) << variant;

    const hf::HfWeights original(dir), exported((work / "exported").string());
    EXPECT_EQ(original.names(), exported.names()) << variant;
    for (const std::string& name : original.names()) {
      const hf::StTensor* a = original.find(name);
      const hf::StTensor* b = exported.find(name);
      ASSERT_NE(b, nullptr) << name;
      EXPECT_EQ(a->dtype, b->dtype) << name;
      EXPECT_EQ(a->shape, b->shape) << name;
      torch::Tensor ta = original.read(name, torch::kDouble),
                    tb = exported.read(name, torch::kDouble);
      EXPECT_TRUE(torch::equal(ta, tb)) << variant << " " << name;
    }
    // And the exported directory imports again to the same model.
    const layers::ModelConfig again = hf::read_hf_config((work / "exported").string());
    EXPECT_EQ(again.sliding_window, hf::read_hf_config(dir).sliding_window) << variant;
    EXPECT_EQ(again.qkv_bias, hf::read_hf_config(dir).qkv_bias) << variant;
    EXPECT_EQ(again.tied_embeddings, hf::read_hf_config(dir).tied_embeddings) << variant;
  }
}

TEST(HfImport, BFloat16CheckpointLoadsIntoBFloat16WithoutAFloat32Copy) {
  engine::MemoryTracker& memory = engine::MemoryTracker::install();
  const std::string dir = make_reference("llama_bf16");
  const layers::ModelConfig config = hf::read_hf_config(dir);
  layers::ParameterStore store(0, torch::kBFloat16);
  layers::LlamaModel model(config, store);
  int64_t store_bytes = 0, largest = 0;
  for (const layers::Parameter& p : store.all()) {
    store_bytes += p.value.nbytes();
    largest = std::max<int64_t>(largest, p.value.nbytes());
  }
  const int64_t before = memory.current_bytes();
  memory.reset_peak();
  hf::load_hf_parameters(dir, config, store, {});
  // One tensor at a time passes through, in bf16: the bytes read and at most one copy of
  // them (the vocabulary padding's), at most twice the largest tensor's bf16 bytes. A float32
  // copy would sit beside the bytes read: three times at least.
  const int64_t extra = memory.peak_bytes() - before;
  EXPECT_LE(extra, 2 * largest) << "store " << store_bytes << " B";
  for (const layers::Parameter& p : store.all())
    EXPECT_EQ(p.value.scalar_type(), torch::kBFloat16) << p.spec.name;
  // And the bf16 model gives the reference logits within bf16 round-off of the logits scale.
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = reference_tensor(dir, "tokens", torch::kLong);
  const torch::Tensor want = reference_tensor(dir, "logits", torch::kFloat);
  const torch::Tensor got =
      model.forward(tokens).narrow(-1, 0, config.vocab_size).to(torch::kFloat);
  EXPECT_LT((got - want).abs().max().item<double>(), 4.0 / 256 * want.abs().max().item<double>());
}

TEST(HfExport, BFloat16ExportOfMainWeightsReloadsToTheMixedPrecisionLogits) {
  const std::string dir = make_reference("llama_gqa_tied");
  const fs::path work = test_dir();
  hf::import_hf(dir, (work / "imported").string());
  hf::ExportOptions options;
  options.dtype = hf::StDtype::BF16;
  hf::export_hf((work / "imported").string(), (work / "exported").string(), options);
  const layers::ModelConfig config = hf::read_hf_config(dir);
  // The student: float32 main weights computing in bf16.
  layers::ParameterStore main(0, torch::kFloat);
  layers::LlamaModel student(config, main);
  student.set_types(torch::kBFloat16, torch::kBFloat16);
  hf::load_hf_parameters(dir, config, main, {});
  // The export, reloaded as bf16 weights.
  layers::ParameterStore exported(0, torch::kBFloat16);
  layers::LlamaModel reloaded(config, exported);
  hf::load_hf_parameters((work / "exported").string(), config, exported, {});
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = reference_tensor(dir, "tokens", torch::kLong);
  const torch::Tensor a = student.forward(tokens).to(torch::kFloat);
  const torch::Tensor b = reloaded.forward(tokens).to(torch::kFloat);
  // Both compute with the same bf16 values (the student's compute copies are its main weights
  // rounded to nearest once, as the export is) through the same operations: the same logits.
  const torch::Tensor real_a = a.narrow(-1, 0, config.vocab_size);
  const torch::Tensor real_b = b.narrow(-1, 0, config.vocab_size);
  EXPECT_TRUE(torch::equal(real_a, real_b))
      << "largest difference " << (real_a - real_b).abs().max().item<double>();
}

// The RoPE scalings are read with their parameters (the logits tests above compare the tables
// built from them with transformers' on a sequence past the original context) and written back
// so that transformers reads the same (HfExport above).
TEST(HfImport, RopeScalingIsReadWithItsParameters) {
  const layers::ModelConfig llama3 = hf::read_hf_config(make_transformers_reference("llama3_rope"));
  EXPECT_EQ(llama3.rope_scaling, layers::RopeScaling::llama3);
  EXPECT_EQ(llama3.rope_factor, 4.0);
  EXPECT_EQ(llama3.rope_low_freq_factor, 1.0);
  EXPECT_EQ(llama3.rope_high_freq_factor, 4.0);
  EXPECT_EQ(llama3.rope_original_context, 8);
  const layers::ModelConfig yarn = hf::read_hf_config(make_transformers_reference("qwen2_yarn"));
  EXPECT_EQ(yarn.rope_scaling, layers::RopeScaling::yarn);
  EXPECT_EQ(yarn.rope_original_context, 8);
  EXPECT_EQ(yarn.rope_beta_fast, 32.0);
  const layers::ModelConfig linear =
      hf::read_hf_config(make_transformers_reference("llama_linear_rope"));
  EXPECT_EQ(linear.rope_scaling, layers::RopeScaling::linear);
  EXPECT_EQ(linear.rope_factor, 2.0);
  EXPECT_EQ(hf::read_hf_config(make_transformers_reference("llama_gqa_tied")).rope_scaling,
            layers::RopeScaling::none);
}
