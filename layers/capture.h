// layers/capture.h: named capture points. A block records its mixer_output, mlp_output and
// block_output ("layers.<i>.<point>") into a sink when the caller asks for them; the sink is
// passed per call, so blocks keep no per-call state.
#pragma once
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

namespace retort::layers {

inline constexpr const char* kCapturePoints[] = {"mixer_output", "mlp_output", "block_output"};

std::string capture_name(int64_t layer, const std::string& point);
// The layer of a capture name "layers.<i>.<point>" (-1 if it is not one).
int64_t capture_layer(const std::string& name);

class CaptureSink {
 public:
  CaptureSink() = default;
  explicit CaptureSink(std::set<std::string> wanted) : wanted_(std::move(wanted)) {}
  void want(const std::string& name) { wanted_.insert(name); }
  bool wants(const std::string& name) const { return wanted_.count(name) > 0; }
  bool wants_any() const { return !wanted_.empty(); }
  void put(const std::string& name, const torch::Tensor& value) {
    if (wants(name)) values_[name] = value;
  }
  const torch::Tensor& at(const std::string& name) const;
  // Removes and returns a capture, so it lives no longer than its consumer needs it.
  torch::Tensor take(const std::string& name);
  bool has(const std::string& name) const { return values_.count(name) > 0; }

 private:
  std::set<std::string> wanted_;
  std::map<std::string, torch::Tensor> values_;
};

}  // namespace retort::layers
