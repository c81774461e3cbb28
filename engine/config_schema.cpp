// engine/config_schema.cpp: the table of configuration keys. Add a key here and in
// train_config.cpp, nowhere else.
#include "engine/config_schema.h"

namespace retort::engine {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<KeySpec> build_keys() {
  using T = KeyType;
  return {
      {"run.dir", T::String, "runs/default", -kInf, kInf, {}, "where checkpoints and metrics go"},
      {"seed", T::Int, "1234", 0, 9.2e18, {}, "seed for initialisation and data order"},

      {"model.vocab_size", T::Int, "256", 1, 1e9, {}, "vocabulary size"},
      {"model.hidden", T::Int, "64", 1, 1e6, {}, "hidden size"},
      {"model.layers", T::Int, "2", 1, 10000, {}, "number of decoder blocks"},
      {"model.heads", T::Int, "4", 1, 10000, {}, "attention heads"},
      {"model.kv_heads", T::Int, "2", 1, 10000, {}, "key/value heads (GQA); divides heads"},
      {"model.ffn_hidden", T::Int, "172", 1, 1e7, {}, "SwiGLU inner size"},
      {"model.rope_theta", T::Float, "10000.0", 1, kInf, {}, "RoPE base"},
      {"model.norm_eps", T::Float, "1e-5", 0, 1, {}, "RMSNorm epsilon"},
      {"model.init_std", T::Float, "0.02", 0, 10, {}, "std of normal initialisation"},
      {"model.sliding_window", T::Int, "0", 0, 1e9, {}, "attention window, 0 = full causal"},
      {"model.layer_windows", T::IntList, "[]", 0, 1e9, {}, "per-layer windows (0 = full)"},
      {"model.qkv_bias", T::Bool, "false", -kInf, kInf, {}, "bias on q, k, v projections"},
      {"model.tied_embeddings", T::Bool, "false", -kInf, kInf, {}, "LM head shares embedding"},
      {"model.dtype",
       T::String,
       "float32",
       -kInf,
       kInf,
       {"float32", "float64"},
       "parameter and compute dtype"},

      {"model.freeze",
       T::StringList,
       "[]",
       -kInf,
       kInf,
       {},
       "glob patterns of parameter names to freeze (no gradient, no optimizer state)"},
      {"model.lr_scales",
       T::StringList,
       "[]",
       -kInf,
       kInf,
       {},
       "per-parameter learning-rate scales as 'glob=scale' (0 = frozen); first match wins"},
      {"model.init.from",
       T::String,
       "",
       -kInf,
       kInf,
       {},
       "checkpoint (file or run dir) whose parameters initialise the model, strictly"},
      {"model.init.reset",
       T::StringList,
       "[]",
       -kInf,
       kInf,
       {},
       "glob patterns of parameters re-initialised after model.init.from"},

      {"teacher.checkpoint",
       T::String,
       "",
       -kInf,
       kInf,
       {},
       "teacher weights (file or run dir); empty = initialised from teacher.seed"},
      {"teacher.seed", T::Int, "0", 0, 9.2e18, {}, "teacher init seed, 0 = the run seed"},
      {"teacher.hidden", T::Int, "0", 0, 1e6, {}, "teacher hidden size, 0 = the student's"},
      {"teacher.layers", T::Int, "0", 0, 10000, {}, "teacher layers, 0 = the student's"},
      {"teacher.heads", T::Int, "0", 0, 10000, {}, "teacher heads, 0 = the student's"},
      {"teacher.kv_heads", T::Int, "0", 0, 10000, {}, "teacher kv heads, 0 = the student's"},
      {"teacher.ffn_hidden", T::Int, "0", 0, 1e7, {}, "teacher SwiGLU size, 0 = the student's"},
      {"teacher.sliding_window", T::Int, "0", 0, 1e9, {}, "teacher attention window, 0 = full"},

      {"distill.lm_weight", T::Float, "1.0", 0, 1e6, {}, "weight of the LM cross-entropy"},
      {"distill.logit_weight", T::Float, "0", 0, 1e6, {}, "weight of the logit loss"},
      {"distill.activation_weight", T::Float, "0", 0, 1e6, {}, "weight of activation losses"},
      {"distill.logit_loss",
       T::String,
       "forward_kl",
       -kInf,
       kInf,
       {"forward_kl", "reverse_kl", "soft_ce"},
       "logit distillation loss"},
      {"distill.temperature", T::Float, "1.0", 1e-3, 1e3, {}, "softmax temperature"},
      {"distill.scale_t2", T::Bool, "true", -kInf, kInf, {}, "multiply the logit loss by T^2"},
      {"distill.teacher_top_k",
       T::Int,
       "0",
       0,
       1e9,
       {},
       "keep the teacher's k largest logits per token (0 = all); forward_kl / soft_ce"},
      {"distill.chunk_tokens",
       T::Int,
       "32",
       1,
       1e9,
       {},
       "tokens per logit-loss chunk (small chunks stay in cache: 32 measured fastest)"},
      {"distill.activation_loss",
       T::String,
       "mse",
       -kInf,
       kInf,
       {"mse", "cosine", "l2"},
       "activation distillation loss"},
      {"distill.activation_pairs",
       T::StringList,
       "[]",
       -kInf,
       kInf,
       {},
       "'layers.i.point=layers.j.point' pairs (student=teacher)"},
      {"distill.activation_points",
       T::StringList,
       "[]",
       -kInf,
       kInf,
       {},
       "capture points distilled at every student layer from the same teacher layer"},

      {"data.paths", T::StringList, "[]", -kInf, kInf, {}, "dataset prefixes (.bin/.idx)"},
      {"data.weights", T::FloatList, "[]", 0, kInf, {}, "blend weights, one per path"},
      {"data.valid_paths",
       T::StringList,
       "[]",
       -kInf,
       kInf,
       {},
       "validation dataset prefixes; empty = hold out data.valid_fraction of each dataset"},
      {"data.valid_fraction", T::Float, "0.05", 0, 0.9, {}, "held-out fraction of documents"},
      {"data.seq_len", T::Int, "32", 1, 1e7, {}, "tokens per sample"},

      {"training.steps", T::Int, "100", 0, 1e12, {}, "optimizer steps to run"},
      {"training.micro_batch", T::Int, "4", 1, 1e6, {}, "samples per micro-batch per rank"},
      {"training.global_batch", T::Int, "8", 1, 1e9, {}, "samples per optimizer step"},
      {"training.log_every", T::Int, "10", 1, 1e9, {}, "steps between metric lines"},
      {"training.eval_every", T::Int, "50", 0, 1e9, {}, "steps between evaluations, 0 = never"},
      {"training.eval_batches", T::Int, "4", 1, 1e6, {}, "global batches per evaluation"},

      {"optimizer.lr", T::Float, "3e-3", 0, 10, {}, "peak learning rate"},
      {"optimizer.min_lr", T::Float, "3e-4", 0, 10, {}, "final learning rate"},
      {"optimizer.schedule",
       T::String,
       "cosine",
       -kInf,
       kInf,
       {"cosine", "linear", "constant"},
       "decay after warmup"},
      {"optimizer.warmup_steps", T::Int, "10", 0, 1e12, {}, "linear warmup steps"},
      {"optimizer.decay_steps", T::Int, "0", 0, 1e12, {}, "decay length, 0 = training.steps"},
      {"optimizer.beta1", T::Float, "0.9", 0, 0.999999, {}, "AdamW beta1"},
      {"optimizer.beta2", T::Float, "0.95", 0, 0.999999, {}, "AdamW beta2"},
      {"optimizer.eps", T::Float, "1e-8", 0, 1, {}, "AdamW epsilon"},
      {"optimizer.weight_decay", T::Float, "0.1", 0, 10, {}, "decoupled weight decay"},
      {"optimizer.zero_stage",
       T::Int,
       "0",
       0,
       1,
       {},
       "1 = shard AdamW state over data-parallel ranks (ZeRO-1)"},
      {"optimizer.grad_clip", T::Float, "1.0", 0, kInf, {}, "global-norm clip, 0 = off"},

      {"checkpoint.save_every", T::Int, "0", 0, 1e12, {}, "steps between saves, 0 = only at end"},
      {"checkpoint.save_at_end", T::Bool, "true", -kInf, kInf, {}, "save after the last step"},
      {"checkpoint.load",
       T::String,
       "",
       -kInf,
       kInf,
       {},
       "checkpoint file or run directory to resume from; empty = fresh start"},

      {"parallel.tensor", T::Int, "1", 1, 1e6, {}, "tensor-parallel ranks"},
      {"parallel.pipeline", T::Int, "1", 1, 1e6, {}, "pipeline stages"},
      {"parallel.pipeline_split",
       T::IntList,
       "[]",
       1,
       1e6,
       {},
       "layers per pipeline stage, first to last; [] = even split (remainder to the first)"},
      {"parallel.data", T::IntOrAuto, "auto", 1, 1e6, {}, "data-parallel ranks or auto"},
      {"parallel.sequence_parallel",
       T::Bool,
       "false",
       -kInf,
       kInf,
       {},
       "shard the residual stream along the sequence over TP"},
      {"parallel.dp_bucket_mb",
       T::Float,
       "4",
       0.001,
       1e5,
       {},
       "data-parallel gradient bucket size (MB); a full bucket is reduced during backward"},

      {"runtime.device",
       T::String,
       "cpu",
       -kInf,
       kInf,
       {"cpu", "cuda"},
       "where tensors live; cuda needs a CUDA libtorch (and NCCL for communication)"},
      {"runtime.threads", T::Int, "0", 0, 1024, {}, "intra-op threads, 0 = cores / local ranks"},
      {"runtime.peak_gflops",
       T::Float,
       "0",
       0,
       kInf,
       {},
       "peak GFLOP/s per rank for MFU, 0 = measure an fp32 GEMM at start"},
  };
}

}  // namespace

const std::vector<KeySpec>& config_keys() {
  static const std::vector<KeySpec> keys = build_keys();
  return keys;
}

const KeySpec* find_key(const std::string& path) {
  for (const KeySpec& k : config_keys())
    if (k.path == path) return &k;
  return nullptr;
}

std::string type_name(KeyType type) {
  switch (type) {
    case KeyType::Int:
      return "an integer";
    case KeyType::IntOrAuto:
      return "an integer or 'auto'";
    case KeyType::Float:
      return "a number";
    case KeyType::Bool:
      return "true or false";
    case KeyType::String:
      return "a string";
    case KeyType::IntList:
      return "a list of integers";
    case KeyType::FloatList:
      return "a list of numbers";
    case KeyType::StringList:
      return "a list of strings";
  }
  return "?";
}

}  // namespace retort::engine
