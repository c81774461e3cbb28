// layers/grad_destinations.cpp: see grad_destinations.h.
#include "layers/grad_destinations.h"

#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace retort::layers {
namespace {

const c10::TensorImpl* key(const torch::Tensor& param) {
  return param.unsafeGetTensorImpl();
}

}  // namespace

struct GradDestinations::Offers {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> by_param;
};

GradDestinations::GradDestinations() : offers_(std::make_unique<Offers>()) {}
GradDestinations::~GradDestinations() = default;

void GradDestinations::offer(const torch::Tensor& param, torch::Tensor destination) {
  if (!destination.is_contiguous() || destination.sizes() != param.sizes() ||
      destination.scalar_type() != param.scalar_type() || destination.device() != param.device())
    throw std::invalid_argument(
        "GradDestinations::offer: the destination must be contiguous, of the parameter's shape, "
        "dtype and device");
  Offers& o = *offers_;
  std::lock_guard<std::mutex> lock(o.mutex);
  o.by_param[key(param)] = std::move(destination);
}

void GradDestinations::withdraw(const torch::Tensor& param) {
  Offers& o = *offers_;
  std::lock_guard<std::mutex> lock(o.mutex);
  o.by_param.erase(key(param));
}

torch::Tensor GradDestinations::take(const torch::Tensor& param) {
  if (param.grad().defined()) return {};
  Offers& o = *offers_;
  std::lock_guard<std::mutex> lock(o.mutex);
  auto it = o.by_param.find(key(param));
  if (it == o.by_param.end()) return {};
  torch::Tensor destination = std::move(it->second);
  o.by_param.erase(it);
  return destination;
}

std::vector<torch::Tensor> GradDestinations::take_stacked(at::TensorList params) {
  Offers& o = *offers_;
  std::lock_guard<std::mutex> lock(o.mutex);
  const char* next = nullptr;
  const torch::Tensor* first = nullptr;
  for (const torch::Tensor& p : params) {
    auto it = o.by_param.find(key(p));
    if (p.grad().defined() || it == o.by_param.end()) return {};
    const torch::Tensor& d = it->second;
    const char* begin = static_cast<const char*>(d.data_ptr());
    // One storage (so one view can span them all), each starting where the last ended.
    if (first && (begin != next || !d.is_alias_of(*first))) return {};
    if (!first) first = &d;
    next = begin + d.numel() * d.element_size();
  }
  std::vector<torch::Tensor> taken;
  for (const torch::Tensor& p : params) {
    auto it = o.by_param.find(key(p));
    taken.push_back(std::move(it->second));
    o.by_param.erase(it);
  }
  return taken;
}

torch::Tensor take_grad_destination(GradDestinations* offers, const torch::Tensor& param) {
  return offers ? offers->take(param) : torch::Tensor();
}

std::vector<torch::Tensor> take_stacked_grad_destinations(GradDestinations* offers,
                                                          at::TensorList params) {
  return offers ? offers->take_stacked(params) : std::vector<torch::Tensor>();
}

}  // namespace retort::layers
