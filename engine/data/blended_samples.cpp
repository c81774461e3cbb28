// engine/data/blended_samples.cpp: see blended_samples.h.
#include "engine/data/blended_samples.h"

namespace retort::engine {

BlendedSamples::BlendedSamples(std::vector<std::shared_ptr<TokenWindows>> sources,
                               std::vector<double> weights)
    : sources_(std::move(sources)), weights_(std::move(weights)), taken_(sources_.size(), 0) {
  double total = 0;
  for (double w : weights_) total += w;
  for (double& w : weights_) w /= total;
}

std::pair<int, int64_t> BlendedSamples::locate(int64_t index) {
  while (int64_t(source_of_.size()) <= index) {
    const double produced = double(source_of_.size() + 1);
    int best = 0;
    double best_lag = -1e300;
    for (size_t s = 0; s < sources_.size(); ++s) {
      const double lag = weights_[s] * produced - double(taken_[s]);
      if (lag > best_lag) best_lag = lag, best = int(s);
    }
    source_of_.push_back(best);
    index_in_source_.push_back(taken_[best]++);
  }
  return {source_of_[index], index_in_source_[index]};
}

void BlendedSamples::sample(int64_t index, int64_t* out) {
  auto [source, local] = locate(index);
  sources_[source]->sample(local, out);
}

}  // namespace retort::engine
