// engine/teacher_cache/teacher_source.h: where a run's teacher comes from and what shape it has: a
// checkpoint (Retort's, or a Hugging Face folder) whose own description decides its shape, any
// teacher.* sizes given having to agree with it; or, without one, the student's shape with the
// teacher.* sizes, initialised from teacher.seed. The trainer and engine_teacher_cache build
// their teachers from it alike, and a teacher cache records its identity.
#pragma once
#include <string>

#include "distill/teacher.h"
#include "engine/config/train_config.h"
#include "parallel/mesh.h"

namespace retort::engine {

struct TeacherSource {
  layers::ModelConfig model;  // as stored (or configured): not padded for any layout
  std::string path;           // the checkpoint as resolved; "" = initialised from the seed
  bool hf = false;            // a Hugging Face folder
  uint64_t seed = 0;
  // What its weights are, in one line: a Retort checkpoint's index CRC (which covers every
  // piece's CRC), every file of a Hugging Face folder read through a CRC, or the seed and shape.
  std::string identity() const;
};

// From the teacher.* keys (settings.teacher for a seed teacher). One line naming the key when
// a size given disagrees with the checkpoint's.
TeacherSource resolve_teacher_source(const DistillSettings& settings);

// Its weights into `teacher` (built from source.model, padded as the run needs); a seed teacher
// was initialised when built. whole: false for a teacher built only up to a layer (its stored
// weights beyond are left). Collective over the mesh for a Retort checkpoint.
void load_teacher_weights(const TeacherSource& source, const layers::ModelConfig& built,
                          parallel::Mesh& mesh, const layers::TensorParallel& tp,
                          distill::Teacher& teacher, bool whole = true);

}  // namespace retort::engine
