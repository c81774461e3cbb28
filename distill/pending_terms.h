// distill/pending_terms.h: a step's loss terms while they are formed, kept where the losses are
// (on the GPU in a CUDA run): each micro-batch adds detached scalars, and settle_into() reads
// them to the host in one transfer at the end of the step, with the step's other scalars (the
// loss, the gradient norm), so the step path waits for the device once.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>

#include "distill/loss_terms.h"

namespace retort::distill {

class PendingTerms {
 public:
  enum class Term { lm, logits, activations };
  void add(Term term, const torch::Tensor& value) { add_to(sums_[name_of(term)], value); }
  void add_pair(const std::string& student_capture, const torch::Tensor& value) {
    add_to(sums_["pair:" + student_capture], value);
    pairs_.emplace(student_capture, "pair:" + student_capture);
  }
  // Any other scalar the step reads at its end (the loss, the gradient norm's square), summed
  // under `name` and read in the same transfer.
  void add_value(const std::string& name, const torch::Tensor& value) {
    add_to(sums_[kValuePrefix + name], value);
  }
  // Adds every pending sum into `terms` (one device-to-host copy), clears, and returns the
  // add_value() sums by name.
  std::map<std::string, double> settle_into(LossTerms& terms) {
    std::map<std::string, double> values;
    if (sums_.empty()) return values;
    std::vector<torch::Tensor> pending;
    for (const auto& [name, sum] : sums_) pending.push_back(sum.reshape({1}));
    const torch::Tensor host = torch::cat(pending).to(torch::kCPU, torch::kDouble);
    const double* read_values = host.data_ptr<double>();
    std::map<std::string, double> read;
    size_t i = 0;
    for (const auto& [name, sum] : sums_) read[name] = read_values[i++];
    terms.lm += read.count("lm") ? read["lm"] : 0.0;
    terms.logits += read.count("logits") ? read["logits"] : 0.0;
    terms.activations += read.count("activations") ? read["activations"] : 0.0;
    for (const auto& [pair, name] : pairs_) terms.per_pair[pair] += read[name];
    for (const auto& [name, value] : read)
      if (name.rfind(kValuePrefix, 0) == 0) values[name.substr(kValuePrefix.size())] = value;
    sums_.clear();
    pairs_.clear();
    return values;
  }

 private:
  // Keys of add_value()'s sums, apart from the terms'.
  static inline const std::string kValuePrefix = "value:";
  static const char* name_of(Term term) {
    switch (term) {
      case Term::lm:
        return "lm";
      case Term::logits:
        return "logits";
      case Term::activations:
        break;
    }
    return "activations";
  }
  // Summed in float64 (as LossTerms' doubles are), detached.
  static void add_to(torch::Tensor& sum, const torch::Tensor& value) {
    const torch::Tensor v = value.detach().to(torch::kDouble).reshape({});
    sum = sum.defined() ? sum + v : v;
  }
  std::map<std::string, torch::Tensor> sums_;
  std::map<std::string, std::string> pairs_;  // student capture -> its key in sums_
};

}  // namespace retort::distill
