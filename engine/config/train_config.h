// engine/config/train_config.h: the typed configuration the engine runs from, assembled from
// the config structs of each concern (model, data, optimizer, checkpoint, distillation),
// each listing its keys next to the code that uses them (key_table.h), plus the keys of the
// run itself below. make_train_config fills it from a Config through the key table, then
// resolves what depends on several keys (layout, stages, the teacher's shape) and checks the
// rules that span keys (batch arithmetic, head counts, window list length, blend weights).
// No torch here.
#pragma once
#include <string>
#include <vector>

#include "distill/distill_config.h"
#include "engine/checkpoint/checkpoint_config.h"
#include "engine/config/config.h"
#include "engine/config/key_table.h"
#include "engine/data/data_config.h"
#include "engine/optim/optimizer_config.h"
#include "layers/memory_config.h"
#include "layers/model_config.h"
#include "parallel/layout.h"
#include "parallel/pipeline_partition.h"

namespace retort::engine {

RETORT_NAMED_ENUM(DType, float32, float64, bfloat16)
RETORT_NAMED_ENUM(Device, cpu, cuda)
RETORT_NAMED_ENUM(ReduceDType, float32, bfloat16)
// teacher.tied_embeddings: whether the teacher's head is its embedding.
RETORT_NAMED_ENUM(TeacherHead, as_student, tied, untied)
RETORT_NAMED_ENUM(KernelChoice, automatic, aten)
RETORT_NAMED_ENUM(GpuTransport, automatic, nccl, host_staged)
RETORT_NAMED_ENUM(P2pRules, mpi, nccl)

#define RETORT_TRAINING_KEYS(KEY)                                                                  \
  KEY(int64_t, steps, "training.steps", 100, 0, 1e12, "optimizer steps to run")                    \
  KEY(int64_t, micro_batch, "training.micro_batch", 4, 1, 1e6, "samples per micro-batch per rank") \
  KEY(int64_t, global_batch, "training.global_batch", 8, 1, 1e9, "samples per optimizer step")     \
  KEY(int64_t, log_every, "training.log_every", 10, 1, 1e9, "steps between metric lines")          \
  KEY(int64_t, eval_every, "training.eval_every", 50, 0, 1e9,                                      \
      "steps between evaluations, 0 = never")                                                      \
  KEY(int64_t, eval_batches, "training.eval_batches", 4, 1, 1e6, "global batches per evaluation")  \
  KEY(int64_t, max_skipped_steps, "training.max_skipped_steps", 10, 1, 1e9,                        \
      "consecutive steps skipped for a non-finite loss or gradient norm before the run stops")

struct TrainingConfig {
  RETORT_TRAINING_KEYS(RETORT_FIELD)
};

// Which parameters train at what rate, and where a student starts from.
#define RETORT_PARAM_POLICY_KEYS(KEY)                                                      \
  KEY(std::vector<std::string>, freeze, "model.freeze", {}, 0, 0,                          \
      "glob patterns of parameter names to freeze (no gradient, no optimizer state)")      \
  KEY(std::vector<std::string>, lr_scales, "model.lr_scales", {}, 0, 0,                    \
      "per-parameter learning-rate scales as 'glob=scale' (0 = frozen); first match wins") \
  KEY(std::string, init_from, "model.init.from", "", 0, 0,                                 \
      "checkpoint (file or run dir) whose parameters initialise the model, strictly")      \
  KEY(std::vector<std::string>, init_reset, "model.init.reset", {}, 0, 0,                  \
      "glob patterns of parameters re-initialised after model.init.from")

struct ParamPolicy {
  RETORT_PARAM_POLICY_KEYS(RETORT_FIELD)
  // lr_scale for a parameter name: first lr_scales match, else 0 if frozen, else 1.
  double lr_scale(const std::string& name) const;
};

// The teacher.* keys; a size of 0 means the student's.
#define RETORT_TEACHER_KEYS(KEY)                                                                 \
  KEY(std::string, checkpoint, "teacher.checkpoint", "", 0, 0,                                   \
      "teacher weights (file or run dir); empty = initialised from teacher.seed")                \
  KEY(std::string, cache, "teacher.cache", "", 0, 0,                                             \
      "a teacher cache (engine_teacher_cache) the logit loss reads instead of running the "      \
      "teacher; empty = run it")                                                                 \
  KEY(int64_t, seed, "teacher.seed", 0, 0, 9.2e18, "teacher init seed, 0 = the run seed")        \
  KEY(int64_t, hidden, "teacher.hidden", 0, 0, 1e6, "teacher hidden size, 0 = the student's")    \
  KEY(int64_t, layers, "teacher.layers", 0, 0, 10000, "teacher layers, 0 = the student's")       \
  KEY(int64_t, heads, "teacher.heads", 0, 0, 10000, "teacher heads, 0 = the student's")          \
  KEY(int64_t, kv_heads, "teacher.kv_heads", 0, 0, 10000, "teacher kv heads, 0 = the student's") \
  KEY(int64_t, ffn_hidden, "teacher.ffn_hidden", 0, 0, 1e7,                                      \
      "teacher SwiGLU size, 0 = the student's")                                                  \
  KEY(int64_t, head_dim, "teacher.head_dim", 0, 0, 1e5,                                          \
      "teacher head width, 0 = the student's model.head_dim (or teacher hidden / heads)")        \
  KEY(int64_t, sliding_window, "teacher.sliding_window", 0, 0, 1e9,                              \
      "teacher attention window, 0 = full")                                                      \
  KEY(TeacherHead, tied_embeddings, "teacher.tied_embeddings", TeacherHead::as_student, 0, 0,    \
      "teacher LM head: as_student (model.tied_embeddings), tied or untied")

struct TeacherKeys {
  RETORT_TEACHER_KEYS(RETORT_FIELD)
};

struct DistillSettings {
  TeacherKeys keys;
  distill::DistillConfig objective;  // the distill.* keys
  // Resolved by make_train_config:
  bool enabled = false;              // any teacher-based weight > 0
  layers::ModelConfig teacher;       // the student's shape with the teacher.* sizes given
  bool teacher_shape_given = false;  // any teacher.<size> key set; else from its checkpoint
  // Whether the run holds and runs a teacher: not when a teacher cache serves every loss.
  bool runs_teacher() const {
    return enabled && (keys.cache.empty() || objective.activation_weight > 0);
  }
};

#define RETORT_PARALLEL_KEYS(KEY)                                                            \
  KEY(int64_t, tensor, "parallel.tensor", 1, 1, 1e6, "tensor-parallel ranks")                \
  KEY(int64_t, pipeline, "parallel.pipeline", 1, 1, 1e6, "pipeline stages")                  \
  KEY(std::vector<int64_t>, pipeline_split, "parallel.pipeline_split", {}, 1, 1e6,           \
      "layers per pipeline stage, first to last; [] = even split (remainder to the first)")  \
  KEY(IntOrAuto, data, "parallel.data", {}, 1, 1e6, "data-parallel ranks or auto")           \
  KEY(bool, sequence_parallel, "parallel.sequence_parallel", false, 0, 0,                    \
      "shard the residual stream along the sequence over TP")                                \
  KEY(double, dp_bucket_mb, "parallel.dp_bucket_mb", 4, 0.001, 1e5,                          \
      "data-parallel gradient bucket size (MB); a full bucket is reduced during backward")   \
  KEY(bool, dp_head_blocks, "parallel.dp_head_blocks", false, 0, 0,                          \
      "form the LM head's weight gradient in backward, block of vocabulary rows by block, "  \
      "and start each block's DP sum at once (the head's logits are formed twice): more of " \
      "the sum hides behind backward where the DP link is slow")                             \
  KEY(bool, dp_shared_memory, "parallel.dp_shared_memory", true, 0, 0,                       \
      "sum data-parallel gradients through shared memory when all DP ranks share a node "    \
      "(not under ZeRO-1); false = MPI all-reduce")                                          \
  KEY(ReduceDType, dp_reduce_dtype, "parallel.dp_reduce_dtype", ReduceDType::float32, 0, 0,  \
      "type the DP gradient sums travel and are summed in over MPI (bfloat16: half the "     \
      "bytes, each partial sum rounded, as NCCL's bf16 sums; the shared-memory sum stays "   \
      "float32)")                                                                            \
  KEY(GpuTransport, gpu_transport, "parallel.gpu_transport", GpuTransport::automatic, 0, 0,  \
      "how groups move GPU tensors: automatic = NCCL where each rank of a group has its "    \
      "own GPU, host-staged MPI where ranks share one; nccl; host_staged (also stages CPU "  \
      "tensors: a test of that path)")                                                       \
  KEY(P2pRules, p2p_rules, "parallel.p2p_rules", P2pRules::mpi, 0, 0,                        \
      "how the pipeline's messages between CPU stages behave: mpi; nccl = under NCCL's "     \
      "pairing rules (queued, launched together at the next wait, one group after another, " \
      "a send done only once its receive is launched): an order that would deadlock NCCL "   \
      "deadlocks here, named by the watchdog")

struct ParallelConfig {
  RETORT_PARALLEL_KEYS(RETORT_FIELD)
};

#define RETORT_RUNTIME_KEYS(KEY)                                                         \
  KEY(Device, device, "runtime.device", Device::cpu, 0, 0,                               \
      "where tensors live; cuda needs a CUDA libtorch (and NCCL for communication)")     \
  KEY(int64_t, gpus_per_node, "runtime.gpus_per_node", 0, 0, 1e6,                        \
      "GPUs a host's ranks take by local rank (local rank mod this); 0 = every GPU the " \
      "process sees")                                                                    \
  KEY(int64_t, threads, "runtime.threads", 0, 0, 1024,                                   \
      "intra-op threads, 0 = cores / local ranks")                                       \
  KEY(double, peak_gflops, "runtime.peak_gflops", 0, 0, kUnbounded,                      \
      "peak GFLOP/s per rank for MFU, 0 = measure the CPU's FMA peak at start")          \
  KEY(KernelChoice, kernels, "runtime.kernels", KernelChoice::automatic, 0, 0,           \
      "automatic: Retort's loops where kernels/dispatch.h routes them; aten: every "     \
      "operation by ATen's operators (RETORT_KERNELS=aten does the same)")               \
  KEY(double, collective_timeout_s, "runtime.collective_timeout_s", 600, 0, kUnbounded,  \
      "end the job when a collective or transfer waits longer, naming the ranks that "   \
      "do not answer (dead or frozen); 0 = wait forever")

struct RuntimeConfig {
  RETORT_RUNTIME_KEYS(RETORT_FIELD)
};

#define RETORT_LOGGING_KEYS(KEY)                                                    \
  KEY(bool, tensorboard, "logging.tensorboard", true, 0, 0,                         \
      "write TensorBoard event files (events.out.tfevents.*) beside metrics.jsonl") \
  KEY(std::vector<int64_t>, profile_steps, "logging.profile_steps", {}, 1, 1e12,    \
      "[first, last]: write a Chrome trace (trace.json in run.dir) of these steps, empty = off")

struct LoggingConfig {
  RETORT_LOGGING_KEYS(RETORT_FIELD)
};

// The keys of the run itself.
#define RETORT_RUN_KEYS(KEY)                                                                     \
  KEY(std::string, run_dir, "run.dir", "runs/default", 0, 0, "where checkpoints and metrics go") \
  KEY(bool, overwrite, "run.overwrite", false, 0, 0,                                             \
      "a fresh run may delete another run's checkpoints and metrics in run.dir (it lists them)") \
  KEY(int64_t, seed, "seed", 1234, 0, 9.2e18, "seed for initialisation and data order")          \
  KEY(DType, dtype, "model.dtype", DType::float32, 0, 0,                                         \
      "compute dtype; bfloat16: float32 main weights, gradients and optimizer state")            \
  KEY(bool, fp32_residual, "model.fp32_residual", false, 0, 0,                                   \
      "bfloat16 only: the residual stream (and pipeline messages) in float32")

struct TrainConfig {
  RETORT_RUN_KEYS(RETORT_FIELD)
  layers::ModelConfig model;
  ParamPolicy params;
  DistillSettings distill;
  DataConfig data;
  TrainingConfig training;
  OptimizerConfig optimizer;
  CheckpointConfig checkpoint;
  ParallelConfig parallel;
  layers::MemoryConfig memory;
  RuntimeConfig runtime;
  LoggingConfig logging;
  // Resolved by make_train_config:
  parallel::Layout layout;                   // data filled in for the world size
  std::vector<parallel::LayerRange> stages;  // the student's layers per pipeline stage

  // Micro-batches each data-parallel rank runs per optimizer step.
  int64_t accumulation_steps() const {
    return training.global_batch / (training.micro_batch * layout.data);
  }
};

// Builds the typed config and checks cross-key rules; throws UserError naming the keys.
TrainConfig make_train_config(const Config& source, int world_size);

}  // namespace retort::engine
