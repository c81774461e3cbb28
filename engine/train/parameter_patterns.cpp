// engine/train/parameter_patterns.cpp: see parameter_patterns.h.
#include "engine/train/parameter_patterns.h"

#include <fnmatch.h>

#include "common/user_error.h"

namespace retort::engine {

void check_parameter_patterns(const ParamPolicy& policy, const layers::ParameterStore& store,
                              parallel::Communicator& stages, std::ostream* log) {
  const size_t freezes = policy.freeze.size(), scales = policy.lr_scales.size();
  // Per freeze pattern, per lr_scales pattern, then the parameters and the trainable ones.
  torch::Tensor counts = torch::zeros({int64_t(freezes + scales) + 2}, torch::kLong);
  auto* count = counts.data_ptr<int64_t>();
  for (const layers::Parameter& p : store.all()) {
    if (p.spec.tied_copy) continue;  // its owner on the first stage counts it
    const char* name = p.spec.name.c_str();
    for (size_t i = 0; i < freezes; ++i)
      count[i] += fnmatch(policy.freeze[i].c_str(), name, 0) == 0;
    for (size_t i = 0; i < scales; ++i) {
      const std::string& rule = policy.lr_scales[i];
      count[freezes + i] += fnmatch(rule.substr(0, rule.rfind('=')).c_str(), name, 0) == 0;
    }
    count[freezes + scales] += 1;
    count[freezes + scales + 1] += !p.spec.frozen();
  }
  stages.all_reduce(counts);
  count = counts.data_ptr<int64_t>();
  for (size_t i = 0; i < freezes; ++i)
    if (count[i] == 0)
      throw UserError("model.freeze: pattern '" + policy.freeze[i] +
                      "' matches no parameter (names look like layers.0.mlp.up_proj.weight, "
                      "layers.*.attn.q_proj.weight, embed.weight)");
  if (!log) return;
  for (size_t i = 0; i < scales; ++i)
    if (count[freezes + i] == 0)
      *log << "retort: warning: model.lr_scales: '" << policy.lr_scales[i]
           << "' matches no parameter: it has no effect\n";
  if (count[freezes + scales] > 0 && count[freezes + scales + 1] == 0)
    *log << "retort: warning: model.freeze and model.lr_scales leave no parameter to train: the "
            "run changes nothing\n";
}

}  // namespace retort::engine
