// common/saved_object.h: a C++ value kept in a custom autograd function's saved data, typed
// and owned by the graph node, where saved_data itself holds only IValues. Used for what the
// backward needs beyond tensors and scalars: a communicator, a loss's settings, the sink that
// takes the head weight's gradient. The value is copied in; pointers inside it are borrowed,
// and their owners (the mesh's communicators, the trainer's sink) outlive every graph.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>

namespace retort {

template <typename T>
struct SavedObject : torch::CustomClassHolder {
  explicit SavedObject(T v) : value(std::move(v)) {}
  T value;
};

template <typename T>
void save_object(torch::autograd::AutogradContext* ctx, const std::string& key, T value) {
  ctx->saved_data[key] =
      c10::IValue::make_capsule(c10::make_intrusive<SavedObject<T>>(std::move(value)));
}

// The value save_object<T> kept under key; T must be the type it was saved as.
template <typename T>
const T& saved_object(torch::autograd::AutogradContext* ctx, const std::string& key) {
  // The capsule stays in saved_data, so the value outlives this reference's use in backward.
  const c10::intrusive_ptr<torch::CustomClassHolder> holder = ctx->saved_data.at(key).toCapsule();
  return static_cast<const SavedObject<T>*>(holder.get())->value;
}

}  // namespace retort
