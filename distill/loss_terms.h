// distill/loss_terms.h: the named parts of a loss (already normalised by the global target
// count): the LM cross-entropy, the logit loss, the activation losses and each activation
// pair's. Plain C++, so metrics and step results carry them without torch.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace retort::distill {

struct LossTerms {
  double lm = 0, logits = 0, activations = 0;
  std::map<std::string, double> per_pair;  // by student capture name

  // Every value in a fixed order (lm, logits, activations, then the pairs by name), for one
  // all-reduce; assign_values takes them back in that order.
  std::vector<double> values() const {
    std::vector<double> v = {lm, logits, activations};
    for (const auto& [name, value] : per_pair) v.push_back(value);
    return v;
  }
  void assign_values(const std::vector<double>& v) {
    lm = v.at(0), logits = v.at(1), activations = v.at(2);
    size_t i = 3;
    for (auto& [name, value] : per_pair) value = v.at(i++);
  }
};

}  // namespace retort::distill
