// tests/unit/safetensors_test.cpp: the safetensors reader on bad files, each a clear error
// naming the file and, where there is one, the tensor: truncated data, a header length beyond
// the file, malformed header JSON, an unknown dtype, overlapping offsets, a hole, a size that
// disagrees with dtype and shape, a missing tensor and a wrong shape on load. Plus the writer
// and reader agreeing on a good file, and a writer that is not finished leaving nothing.
#include "engine/hf/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/user_error.h"
#include "engine/hf/hf_model.h"
#include "layers/model.h"
#include "tests/support/scratch_dir.h"

namespace fs = std::filesystem;
using namespace retort;

namespace {

fs::path scratch(const std::string& name) {
  static const fs::path dir = retort::testing::scratch_dir("safetensors_test");
  return dir / name;
}

// A file of: 8-byte length (given, or the header's own), the header text, `data_bytes` zeros.
std::string write_file(const std::string& name, const std::string& header, size_t data_bytes,
                       int64_t claimed_length = -1) {
  const fs::path path = scratch(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = claimed_length >= 0 ? uint64_t(claimed_length) : header.size();
  for (int i = 0; i < 8; ++i) out.put(char(length >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
  return path.string();
}

// The error message of opening `path` (empty if it opens).
std::string open_error(const std::string& path) {
  try {
    hf::SafetensorsFile file(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& path, const std::string& fragment) {
  const std::string message = open_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos)
      << "want '" << fragment << "' in: " << message;
}

const std::string kTwo =
    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[3],"data_offsets":[8,14]}})";

}  // namespace

TEST(Safetensors, AGoodFileOpens) {
  EXPECT_EQ(open_error(write_file("good.safetensors", kTwo, 14)), "");
}

TEST(Safetensors, TruncatedDataNamesTheTensor) {
  expect_error(write_file("truncated.safetensors", kTwo, 10), "tensor 'b'");
  expect_error(write_file("truncated2.safetensors", kTwo, 10), "truncated");
}

TEST(Safetensors, HeaderLengthBeyondTheFile) {
  expect_error(write_file("long_header.safetensors", kTwo, 14, 1000), "beyond the file");
  expect_error(write_file("huge_header.safetensors", kTwo, 14, int64_t(1) << 40),
               "above the 100 MB limit");
  const fs::path tiny = scratch("tiny.safetensors");
  std::ofstream(tiny) << "abc";
  expect_error(tiny.string(), "shorter than the header length");
}

TEST(Safetensors, MalformedHeaderJson) {
  expect_error(write_file("malformed.safetensors", R"({"a":{"dtype":"F32",)", 8),
               "malformed header JSON");
  expect_error(write_file("not_object.safetensors", "[1,2]", 0), "does not start with '{'");
}

TEST(Safetensors, UnknownDtypeNamesTheTensor) {
  expect_error(write_file("dtype.safetensors",
                          R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8),
               "tensor 'w': unknown dtype 'F7'");
}

TEST(Safetensors, OverlappingOffsetsHolesAndSizes) {
  expect_error(
      write_file(
          "overlap.safetensors",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      "tensor 'b' overlaps");
  expect_error(
      write_file(
          "hole.safetensors",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
          20),
      "a hole of 4 bytes before tensor 'b'");
  expect_error(write_file("size.safetensors",
                          R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               "tensor 'a': data_offsets cover 8 bytes, its dtype and shape 12");
  expect_error(write_file("tail.safetensors", kTwo, 20), "6 bytes after the last tensor");
}

TEST(Safetensors, WriterAndReaderAgree) {
  const std::string path = scratch("written.safetensors").string();
  std::vector<float> a = {1.5f, -2.0f, 3.25f};
  std::vector<uint16_t> b = {1, 2};
  {
    hf::SafetensorsWriter writer(
        path, {{"a", hf::StDtype::F32, {3}}, {"b", hf::StDtype::BF16, {1, 2}}}, {{"format", "pt"}});
    writer.write("a", a.data(), 12);
    EXPECT_THROW(writer.write("a", a.data(), 12), UserError);  // not the next one declared
    writer.write("b", b.data(), 4);
    writer.finish();
  }
  hf::SafetensorsFile file(path);
  ASSERT_EQ(file.header().tensors.size(), 2u);
  EXPECT_EQ(file.header().metadata.at("format"), "pt");
  const hf::StTensor* ta = file.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(std::memcmp(file.bytes(*ta), a.data(), 12), 0);
  EXPECT_EQ(file.find("b")->shape, (std::vector<int64_t>{1, 2}));
  // The data section starts 8-aligned.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file.bytes(*ta)) % 8, 0u);
}

TEST(Safetensors, AnUnfinishedWriterLeavesNoFile) {
  const std::string path = scratch("unfinished.safetensors").string();
  fs::remove(path);
  { hf::SafetensorsWriter writer(path, {{"a", hf::StDtype::F32, {1}}}); }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

// A model directory whose config.json asks for tensors the file lacks, or has other shapes.
TEST(Safetensors, MissingTensorAndWrongShapeNameFileAndTensor) {
  const fs::path dir = scratch("model_dir");
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type":"llama","vocab_size":8,"hidden_size":4,"num_hidden_layers":1,)"
      << R"("num_attention_heads":2,"num_key_value_heads":1,"intermediate_size":6,"tie_word_embeddings":true})";
  layers::ModelConfig config = hf::read_hf_config(dir.string());
  std::vector<hf::SafetensorsWriter::Entry> entries = {
      {"model.embed_tokens.weight", hf::StDtype::F32, {8, 4}}};
  {
    hf::SafetensorsWriter writer((dir / "model.safetensors").string(), entries);
    std::vector<float> zeros(32);
    writer.write("model.embed_tokens.weight", zeros.data(), 128);
    writer.finish();
  }
  layers::ParameterStore store(0, torch::kFloat);
  layers::LlamaModel model(config, store);
  try {
    hf::load_hf_parameters(dir.string(), config, store, {});
    ADD_FAILURE() << "a missing tensor loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is missing"), std::string::npos) << e.what();
  }
  config.hidden = 8;  // the file's embedding is [8, 4]
  config.heads = 2;
  layers::ParameterStore wider(0, torch::kFloat);
  layers::LlamaModel wide_model(config, wider);
  try {
    hf::load_hf_parameters(dir.string(), config, wider, {});
    ADD_FAILURE() << "a wrong shape loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.embed_tokens.weight' has shape [8,4]"),
              std::string::npos)
        << e.what();
  }
}
