// parallel/stage_collect.cpp: see stage_collect.h.
#include "parallel/stage_collect.h"

#include <stdexcept>

namespace retort::parallel {
namespace {
constexpr int kTag = 300;
const torch::ScalarType kTypes[] = {torch::kFloat, torch::kDouble, torch::kLong, torch::kInt,
                                    torch::kByte};

int64_t type_code(torch::ScalarType type) {
  for (int64_t i = 0; i < int64_t(std::size(kTypes)); ++i)
    if (kTypes[i] == type) return i;
  throw std::invalid_argument("collect_on_first_rank: unsupported dtype " +
                              std::string(c10::toString(type)));
}

torch::Tensor longs(std::vector<int64_t> values) {
  return torch::tensor(values, torch::kLong);
}
}  // namespace

NamedTensors collect_on_first_rank(Communicator& group, NamedTensors local) {
  if (group.size() == 1) return local;
  if (group.rank() != 0) {
    group.send(longs({int64_t(local.size())}), 0, kTag);
    for (const auto& [name, tensor] : local) {
      // Header: name length, dtype code, rank, sizes.
      std::vector<int64_t> header = {int64_t(name.size()), type_code(tensor.scalar_type()),
                                     tensor.dim()};
      for (int64_t size : tensor.sizes()) header.push_back(size);
      group.send(longs({int64_t(header.size())}), 0, kTag);
      group.send(longs(header), 0, kTag);
      group.send(torch::tensor(std::vector<uint8_t>(name.begin(), name.end()), torch::kByte), 0,
                 kTag);
      if (tensor.numel() > 0) group.send(tensor.contiguous(), 0, kTag);
    }
    return {};
  }
  NamedTensors all = std::move(local);
  for (int rank = 1; rank < group.size(); ++rank) {
    torch::Tensor count = torch::empty({1}, torch::kLong);
    group.recv(count, rank, kTag);
    for (int64_t i = 0; i < count.item<int64_t>(); ++i) {
      torch::Tensor header_size = torch::empty({1}, torch::kLong);
      group.recv(header_size, rank, kTag);
      torch::Tensor header = torch::empty({header_size.item<int64_t>()}, torch::kLong);
      group.recv(header, rank, kTag);
      auto h = header.accessor<int64_t, 1>();
      torch::Tensor name = torch::empty({h[0]}, torch::kByte);
      group.recv(name, rank, kTag);
      std::vector<int64_t> sizes;
      for (int64_t d = 0; d < h[2]; ++d) sizes.push_back(h[3 + d]);
      torch::Tensor tensor = torch::empty(sizes, kTypes[h[1]]);
      if (tensor.numel() > 0) group.recv(tensor, rank, kTag);
      const auto* chars = reinterpret_cast<const char*>(name.data_ptr());
      all.emplace_back(std::string(chars, chars + h[0]), tensor);
    }
  }
  return all;
}

}  // namespace retort::parallel
