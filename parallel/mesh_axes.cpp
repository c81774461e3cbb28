// parallel/mesh_axes.cpp: see mesh_axes.h.
#include "parallel/mesh_axes.h"

#include <algorithm>

namespace retort::parallel {

MeshCoordinates coordinates_of(int rank, const Layout& layout) {
  MeshCoordinates c;
  c.tp = rank % layout.tensor;
  c.dp = (rank / layout.tensor) % layout.data;
  c.pp = rank / (layout.tensor * layout.data);
  return c;
}

std::vector<AxisSize> mesh_axes(const Layout& layout) {
  return {{MeshAxis::pipeline, layout.pipeline},
          {MeshAxis::data, layout.data},
          {MeshAxis::tensor, layout.tensor}};
}

GroupPlace group_place(int world_rank, const Layout& layout, const std::vector<MeshAxis>& along) {
  const std::vector<AxisSize> axes = mesh_axes(layout);
  // The rank's coordinate on each axis, innermost varying fastest.
  std::vector<int> coordinate(axes.size());
  int rest = world_rank;
  for (size_t a = axes.size(); a-- > 0;) {
    coordinate[a] = rest % axes[a].size;
    rest /= axes[a].size;
  }
  GroupPlace place;
  for (size_t a = 0; a < axes.size(); ++a) {
    const bool inside = std::find(along.begin(), along.end(), axes[a].axis) != along.end();
    int& number = inside ? place.key : place.color;
    number = number * axes[a].size + coordinate[a];
  }
  return place;
}

}  // namespace retort::parallel
