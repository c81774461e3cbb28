// parallel/mesh_axes.h: the mesh's named axes as plain arithmetic on a resolved layout, no MPI
// and no torch: each rank's coordinates, the axes with their sizes (outermost first), where a
// rank sits in the group along some axes (what MPI_Comm_split takes), and the slice of the
// batch a rank reads. parallel/mesh.h builds its groups from these.
#pragma once
#include <vector>

#include "parallel/layout.h"

namespace retort::parallel {

struct MeshCoordinates {
  int tp = 0, pp = 0, dp = 0;
};

// A named axis of the mesh, outermost first.
enum class MeshAxis { pipeline, data, tensor };
// The axes of a resolved layout with their sizes, outermost first.
struct AxisSize {
  MeshAxis axis;
  int size;
};
std::vector<AxisSize> mesh_axes(const Layout& layout);

// The ranks of a mesh that differ only along `along`, as (color, key) for MPI_Comm_split: the
// color numbers the other axes' coordinates, the key this rank's place among `along`'s, both
// outermost first. Pure arithmetic, no MPI.
struct GroupPlace {
  int color = 0, key = 0;
};
GroupPlace group_place(int world_rank, const Layout& layout, const std::vector<MeshAxis>& along);

// Which slice of each global batch this rank reads: `index` of `count` equal slices.
struct DataSplit {
  int index = 0, count = 1;
};

// Coordinates of a world rank in a resolved layout (pure arithmetic, no MPI).
MeshCoordinates coordinates_of(int world_rank, const Layout& layout);

}  // namespace retort::parallel
