// engine/teacher_cache/cache_command.h: engine_teacher_cache, the command that runs a teacher
// once over a run's training data and stores its top k per position (cache_store.h):
//   mpirun -np N engine_teacher_cache CONFIG.yaml [key=value ...] --out DIR [--top-k K]
//          [--samples N] [--samples-per-shard S] [--values float16|float64] [--resume]
//   engine_teacher_cache --info DIR
// The teacher is CONFIG's teacher: section, run under CONFIG's own layout (parallel.tensor,
// parallel.pipeline, parallel.sequence_parallel, parallel.data), whatever the layouts of the
// students that will read the cache. Shards go to the data-parallel groups in turn; each group's
// last stage's first TP rank writes its own. The samples are the training stream's, 0 .. N - 1
// (default: the training.steps x training.global_batch the config's run draws), and in
// DIR/valid the validation samples the run evaluates on.
#pragma once
#include <iosfwd>
#include <string>

#include "engine/config/train_config.h"
#include "engine/teacher_cache/cache_store.h"
#include "parallel/mesh.h"
#include "parallel/mpi_runtime.h"

namespace retort::engine {

struct TeacherCacheRequest {
  std::string out;      // the cache's folder
  int64_t top_k = 0;    // 0: distill.teacher_top_k
  int64_t samples = 0;  // 0: training.steps x training.global_batch
  int64_t samples_per_shard = 64;
  CacheValueType values = CacheValueType::float16;
  bool resume = false;  // complete the cache in `out`
};

// Writes (or completes) the cache of config's teacher over its training samples under the
// mesh's layout (config.layout, resolved for the teacher too), and over the validation samples
// a run evaluates on (training.eval_batches x training.global_batch, where the data has a
// validation split) in validation_cache_dir(out). Collective over mesh.world(); bad input is a
// UserError on every rank. log: progress lines (null: none).
void write_teacher_cache(const TrainConfig& config, const TeacherCacheRequest& request,
                         parallel::Mesh& mesh, std::ostream* log);

// 0 on success; bad input throws UserError (the same on every rank).
int run_teacher_cache_command(int argc, char** argv, parallel::MpiRuntime& mpi);

}  // namespace retort::engine
