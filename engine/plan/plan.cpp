// engine/plan/plan.cpp: see plan.h. The communication rules mirror the layers and the step:
// tests/mpi/comm_volume_test.cpp derives the per-micro-batch TP and STP counts; the per-step
// scalars are the trainer's (engine/train/trainer.cpp: the world's agreement flags, the loss
// sums over PP and DP, the token count over DP, the gradient norm's partial sums).
#include "engine/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/user_error.h"
#include "engine/config/precision_policy.h"
#include "engine/observe/metrics.h"

namespace retort::engine {
namespace {

constexpr int64_t kScalar = 8;  // the step's scalar reductions travel as float64

struct StageShape {
  int64_t layers = 0;
  bool first = true, last = true;
};

StageShape stage_of(const TrainConfig& c, int pp) {
  StageShape s;
  if (c.stages.empty()) {
    s.layers = c.model.layers;
    return s;
  }
  s.layers = c.stages.at(size_t(pp)).size();
  s.first = pp == 0;
  s.last = pp == c.layout.pipeline - 1;
  return s;
}

int64_t main_bytes(const TrainConfig& c) {
  return bytes_of(precision_policy(c).main);
}

// Bytes of one activation element on the wire (TP collectives) and between stages.
int64_t activation_bytes(const TrainConfig& c) {
  return bytes_of(precision_policy(c).tp_activation_sum);
}
int64_t pipeline_bytes(const TrainConfig& c) {
  return bytes_of(precision_policy(c).pipeline_message);
}

// The terms summed with the loss each step (distill::LossTerms::values after the loss).
int64_t loss_values(const TrainConfig& c) {
  if (!c.distill.enabled) return 1;
  return 1 + 3 + int64_t(c.distill.objective.pairs.size());
}

}  // namespace

PlanParameters plan_parameters(const TrainConfig& c, const PlanRank& rank) {
  const layers::ModelConfig& m = c.model;
  const int64_t T = c.layout.tensor, h = m.hidden, d = m.head_dim();
  const StageShape stage = stage_of(c, rank.pp);
  const int64_t vocab = layers::padded_vocab_size(m.vocab_size, int(T)) / T * h;
  PlanParameters p;
  const int64_t q = h * m.heads * d / T + (m.qkv_bias ? m.heads * d / T : 0);
  const bool kv_replicated = m.kv_heads % T != 0;
  const int64_t kv_one = kv_replicated
                             ? h * m.kv_heads * d + (m.qkv_bias ? m.kv_heads * d : 0)
                             : h * m.kv_heads * d / T + (m.qkv_bias ? m.kv_heads * d / T : 0);
  const int64_t o = m.heads * d / T * h;
  const int64_t mlp = 3 * h * m.ffn_hidden / T;
  const int64_t norms = 2 * h;
  const int64_t qk_norms = m.qk_norm ? 2 * d : 0;  // whole on every TP rank, gradients summed
  p.held = stage.layers * (q + 2 * kv_one + o + mlp + norms + qk_norms);
  if (T > 1) p.partial_over_tp += stage.layers * qk_norms;
  const bool sequence = c.layout.sequence_parallel && T > 1;
  if (kv_replicated) p.partial_over_tp += stage.layers * 2 * kv_one;
  if (sequence) p.partial_over_tp += stage.layers * norms + (stage.last ? h : 0);
  if (stage.first) p.held += vocab;
  if (stage.last) {
    p.held += h;  // the final norm
    if (!m.tied_embeddings)
      p.held += vocab;
    else if (!stage.first)
      p.held += vocab, p.tied_embedding = vocab;  // the head's copy of the embedding
  }
  if (stage.first && m.tied_embeddings && !stage.last) p.tied_embedding = vocab;
  p.trainable = p.held;
  return p;
}

bool plan_dp_in_shared_memory(const TrainConfig& c, int64_t ranks_per_host) {
  const int64_t T = c.layout.tensor, D = c.layout.data;
  const int64_t world = T * c.layout.pipeline * D;
  const int64_t per_host = ranks_per_host > 0 ? std::min(ranks_per_host, world) : world;
  // DP ranks are T apart in the rank order; a host holds per_host consecutive ranks.
  const int64_t dp_per_host = T >= per_host ? 1 : std::min(D, per_host / T);
  return c.runtime.device == Device::cpu && c.parallel.dp_shared_memory &&
         c.optimizer.zero_stage == 0 && D > 1 && dp_per_host >= 2 && D % dp_per_host == 0;
}

std::map<std::string, int64_t> plan_communication(const TrainConfig& c, const PlanRank& rank,
                                                  int64_t ranks_per_host) {
  std::map<std::string, int64_t> bytes;
  const int64_t T = c.layout.tensor, P = c.layout.pipeline, D = c.layout.data;
  const int64_t micro = c.accumulation_steps();
  const int64_t tokens = c.training.micro_batch * c.data.seq_len;
  // Tensor-parallel sums of activations travel in their own type too (parallel/primitives.cpp).
  const int64_t act = tokens * c.model.hidden * activation_bytes(c);
  // The cross-entropy's per-token reductions, in the accumulation type.
  const int64_t per_token = tokens * bytes_of(precision_policy(c).accumulation);
  const StageShape stage = stage_of(c, rank.pp);
  const int64_t L = stage.layers;
  const bool sequence = c.layout.sequence_parallel && T > 1;
  const bool full_recompute = c.memory.activation_checkpointing == layers::Checkpointing::full;
  const PlanParameters params = plan_parameters(c, rank);
  const int64_t grad_bytes = main_bytes(c);
  auto add = [&](const std::string& key, int64_t n) {
    if (n != 0) bytes[key] += n;
  };
  if (T > 1) {
    // Per micro-batch: each block's two row-parallel exits forward and two column-parallel
    // entries backward; the embedding's exit (first stage); the head's entry and the
    // cross-entropy's three per-token reductions (last stage).
    const int64_t recompute = full_recompute ? 2 * L : 0;
    if (!sequence) {
      add("tp/all_reduce", micro * ((4 * L + stage.first + stage.last + recompute) * act +
                                    (stage.last ? 3 * per_token : 0)));
    } else {
      add("tp/all_gather", micro * (4 * L + stage.first + stage.last + recompute) * act);
      add("tp/reduce_scatter", micro * (4 * L + stage.first + stage.last + recompute) * act);
      add("tp/all_reduce", micro * (stage.last ? 3 * per_token : 0));
    }
    add("tp/all_reduce", params.partial_over_tp * grad_bytes);
    add("tp/all_reduce", kScalar);  // the gradient norm's sharded part
  }
  if (P > 1) {
    const int64_t message = tokens / (sequence ? T : 1) * c.model.hidden * pipeline_bytes(c);
    const int64_t neighbours = int64_t(!stage.first) + int64_t(!stage.last);
    add("pp/send", micro * neighbours * message);
    add("pp/recv", micro * neighbours * message);
    add("pp/all_reduce", kScalar * loss_values(c) + kScalar);  // loss sum, gradient norm
    if (params.tied_embedding > 0) add("embedding/all_reduce", params.tied_embedding * grad_bytes);
  }
  if (D > 1) {
    // The shared-memory sum adds the main gradients where they lie, whatever the key says.
    const int64_t reduce_bytes = plan_dp_in_shared_memory(c, ranks_per_host)
                                     ? grad_bytes
                                     : bytes_of(precision_policy(c).dp_gradient_sum);
    if (c.optimizer.zero_stage >= 1) {
      add("dp/reduce_scatter", params.trainable * reduce_bytes);
      add("dp/all_gather", params.trainable * main_bytes(c));
      add("dp/all_reduce", kScalar);  // the gradient norm over the owners
    } else {
      add("dp/all_reduce", params.trainable * reduce_bytes);
    }
    add("dp/all_reduce", kScalar * loss_values(c) + kScalar);  // loss sum, target count
  }
  if (c.distill.runs_teacher()) {
    // The teacher's forward, in the student's layout (an estimate: the tests check LM steps):
    // per micro-batch its blocks' row-parallel exits, its embedding's and its head's entry,
    // and its hidden state travelling the pipeline beside the student's.
    const layers::ModelConfig& t = c.distill.teacher;
    const int64_t teacher_act = tokens * t.hidden * activation_bytes(c);
    const int64_t layers_here = (t.layers + P - 1) / P;
    if (T > 1 && !sequence)
      add("tp/all_reduce", micro * (2 * layers_here + stage.first) * teacher_act);
    if (T > 1 && sequence) {
      add("tp/all_gather", micro * (2 * layers_here + stage.last) * teacher_act);
      add("tp/reduce_scatter", micro * (2 * layers_here + stage.first) * teacher_act);
    }
    if (P > 1) {
      const int64_t message = tokens / (sequence ? T : 1) * t.hidden * pipeline_bytes(c);
      add("pp/send", micro * int64_t(!stage.last) * message);
      add("pp/recv", micro * int64_t(!stage.first) * message);
    }
  }
  if (T * P * D > 1) add("world/all_reduce", 3 * kScalar);  // non-finite and stop flags
  return bytes;
}

DeviceKind device_kind(const std::string& name) {
  // Datasheet figures: dense bf16 rate, HBM, NVLink per GPU (one direction), and one
  // 400 Gbit/s InfiniBand port per GPU; the CPU row is this project's 2-core machines over
  // 1 Gbit/s Ethernet, its rate the fp32 FMA peak of one core.
  if (name == "h100") return {"h100", 989, 0.4, 80, 0.9, 450, 50, 5};
  if (name == "a100") return {"a100", 312, 0.45, 80, 0.9, 300, 25, 5};
  if (name == "cpu") return {"cpu", 0.1, 0.3, 24, 0.9, 10, 0.125, 100};
  throw UserError("--device " + name + ": the planner knows h100, a100 and cpu");
}

PlanMemory plan_memory(const TrainConfig& c, const PlanRank& rank) {
  const layers::ModelConfig& m = c.model;
  const PlanParameters params = plan_parameters(c, rank);
  const PrecisionPolicy precision = precision_policy(c);
  const bool bf16 = precision.mixed();
  const int64_t main = main_bytes(c), compute = bytes_of(precision.compute);
  PlanMemory mem;
  mem.main_weights = bf16 ? params.held * main : 0;
  mem.gradients = params.trainable * main;
  const int64_t owners = c.optimizer.zero_stage >= 1 ? c.layout.data : 1;
  mem.optimizer = 2 * params.trainable * main / owners;
  // Saved for backward per token and layer, as the fused block keeps it (layers/block.h):
  // the block's input and its middle residual (sequence-sharded under STP), both norms'
  // outputs, the packed q|k|v product, the attention output and its per-head log-sum-exp,
  // SwiGLU's gate, up and product; under STP also the two gathered (whole-sequence) inputs of
  // the column products, in float32 (measured: tests/mpi/plan_memory_test.cpp). Selective
  // recomputation changes none of these (blocked attention keeps no scores, the fused SwiGLU
  // no more than its inputs); full recomputation keeps each block's input, plus one block's
  // whole set while it is recomputed.
  const StageShape stage = stage_of(c, rank.pp);
  const int64_t T = c.layout.tensor, s = c.data.seq_len, h = m.hidden, f = m.ffn_hidden / T;
  const bool sequence = c.layout.sequence_parallel && T > 1;
  const int64_t residual = sequence ? h / T : h;
  const int64_t kv = m.kv_heads * m.head_dim() / std::min<int64_t>(T, m.kv_heads);
  const int64_t q = m.heads * m.head_dim() / T;
  const int64_t element = compute;
  const int64_t block = (2 * residual + 2 * h + (q + 2 * kv) + q + m.heads / T + 3 * f) * element +
                        (sequence ? 2 * h * 4 : 0);  // bytes per token
  const int64_t in_flight = std::min<int64_t>(c.layout.pipeline - rank.pp, c.accumulation_steps());
  const int64_t tokens = c.training.micro_batch * s;
  const bool full = c.memory.activation_checkpointing == layers::Checkpointing::full;
  // Outside the blocks: the embedding's output (first stage), the stage's output awaiting its
  // gradient (all but the last stage), the final norm's input and output (last stage), and one
  // chunk of the fused head's logits.
  const int64_t outside =
      ((stage.first ? residual : 0) + (stage.last ? residual + h : residual)) * element;
  const int64_t head_chunk = c.memory.head_chunk_tokens > 0 ? c.memory.head_chunk_tokens : tokens;
  const int64_t vocab_rows = layers::padded_vocab_size(m.vocab_size, int(T)) / T;
  // bf16 copies cast at each use (memory.keep_compute_weights false) live only through their
  // product: the largest of them, the head's shard on the last stage, else a block's gate|up.
  const bool copies_kept = !bf16 || c.memory.keep_compute_weights;
  mem.weights = copies_kept ? params.held * compute
                            : std::max(stage.last ? vocab_rows * h : 0, 2 * f * h) * compute;
  const int64_t kept = full ? stage.layers * residual * element : stage.layers * block;
  int64_t logits_chunk = stage.last ? std::min(head_chunk, tokens) * vocab_rows * element : 0;
  // On a GPU a bf16 chunk's head weight gradient is one product with a float32 result, added
  // to the gradient: one float32 head shard beside the chunk's logits.
  if (stage.last && bf16 && c.runtime.device == Device::cuda && c.memory.head_chunk_tokens > 0)
    logits_chunk += vocab_rows * h * bytes_of(precision.accumulation);
  const int64_t saved = in_flight * tokens * (kept + outside);
  const int64_t recomputed = full ? tokens * (block - residual * element) : 0;
  mem.activations = saved + recomputed + logits_chunk;
  // The peak. At the end of the forward that fills the pipeline: the saved activations and
  // one logits chunk, and the gradient buffers only when a backward already ran in this step
  // (more micro-batches than in flight). In the stage's last block's MLP backward: the saved
  // activations (and the block recomputed under full), less the logits chunk (freed by the
  // loss's backward) and SwiGLU's product (freed by the down projection's backward); beside
  // them the incoming gradient (whole-sequence under STP), the product's and the gate|up
  // pair's gradients; the gradients formed by then: every buffer after an earlier backward of
  // this step, else the down projection's (and on the last stage the head's and final norm's).
  const bool backward_before = c.accumulation_steps() > in_flight;
  // A tied head's gradient deferred to the lookup's backward (memory.defer_head_gradient: the
  // LM loss on one stage holding both, its gradient not taken by the optimizer in backward or
  // by the DP reduction) is formed last.
  const bool head_deferred = c.memory.defer_head_gradient && m.tied_embeddings && stage.first &&
                             stage.last && !c.distill.enabled && !c.optimizer.in_backward &&
                             c.layout.data == 1;
  const int64_t first_gradients =
      (h * f + (stage.last ? (head_deferred ? 0 : vocab_rows * h) + h : 0)) * main;
  const int64_t gradients_in_backward =
      backward_before ? mem.gradients : std::min(mem.gradients, first_gradients);
  const int64_t activations_in_backward =
      saved + recomputed - tokens * f * element;  // less SwiGLU's product
  const int64_t temporaries = tokens * (h + 3 * f) * element;
  const int64_t forward_end = saved + logits_chunk + (backward_before ? mem.gradients : 0);
  if (forward_end >= activations_in_backward + gradients_in_backward + temporaries) {
    mem.peak_activations = saved + logits_chunk;
    mem.peak_gradients = backward_before ? mem.gradients : 0;
  } else {
    mem.peak_activations = activations_in_backward;
    mem.peak_gradients = gradients_in_backward;
    mem.peak_temporaries = temporaries;
  }
  if (c.distill.runs_teacher()) {
    const layers::ModelConfig& t = c.distill.teacher;
    TrainConfig teacher_config = c;
    teacher_config.model = t;
    teacher_config.stages.clear();
    const PlanParameters teacher = plan_parameters(teacher_config, {rank.tp, 0, rank.dp});
    mem.teacher = teacher.held / std::max<int64_t>(1, c.layout.pipeline) * compute +
                  tokens * int64_t(c.distill.objective.pairs.size()) * t.hidden * compute;
  }
  return mem;
}

PlanTime plan_time(const TrainConfig& c, const ClusterShape& cluster) {
  PlanTime t;
  const int64_t T = c.layout.tensor, P = c.layout.pipeline, D = c.layout.data;
  const int64_t seq = c.data.seq_len;
  const double student = c.model.training_flops_per_token(seq);
  // Recomputation in backward: the blocks' forward again (full), or the attention core's
  // (selective): what the FLOPs grow by from sequence 1 to seq, a third of it forward.
  double recompute = 0;
  if (c.memory.activation_checkpointing == layers::Checkpointing::full) recompute = student / 3;
  if (c.memory.activation_checkpointing == layers::Checkpointing::selective)
    recompute = (student - c.model.training_flops_per_token(1)) / 3;
  const double teacher =
      c.distill.runs_teacher() ? c.distill.teacher.training_flops_per_token(seq) / 3 : 0;
  // The LM head's three products (logits, d/dx, d/dW). The fused head forms all three in
  // forward; when its weight's gradient streams in blocks (optimizer-in-backward, or
  // parallel.dp_head_blocks under DP) backward forms the logits again and then d/dW.
  const double head = 6.0 * double(c.model.vocab_size) * double(c.model.hidden);
  const bool fused_head = c.memory.head_chunk_tokens > 0;
  const bool head_streams =
      fused_head && (c.optimizer.in_backward || (c.parallel.dp_head_blocks && D > 1));
  const double head_again = head_streams ? head / 3 : 0;
  // Backward's share, the window the DP buckets travel in: the blocks' two thirds and their
  // recomputation, and the head's part that runs there.
  const double head_backward = !fused_head ? head * 2 / 3 : head_streams ? head * 2 / 3 : 0;
  const double backward = (student - head) * 2 / 3 + recompute + head_backward;
  const double tokens_per_rank = double(c.training.global_batch * seq) / double(D);
  const double rate = cluster.device.tflops * 1e12 * cluster.device.efficiency;
  const double seconds_per_flop_per_token = tokens_per_rank / double(T * P) / rate;
  t.compute_s = (student + recompute + head_again + teacher) * seconds_per_flop_per_token;
  const int64_t micro = c.accumulation_steps();
  t.backward_window_s = backward * seconds_per_flop_per_token / double(micro);
  if (P > 1) t.bubble_s = t.compute_s * double(P - 1) / double(micro);
  // Seconds on the wire per rank, by group: ring algorithms move 2 (n-1)/n of an all-reduce's
  // message, (n-1)/n of what a gather or scatter counts; a send moves its message once.
  const std::map<std::string, int64_t> bytes =
      plan_communication(c, PlanRank{}, cluster.gpus_per_node);
  auto seconds = [&](const std::string& group, int64_t n, const std::string& only = "") {
    const double bandwidth = plan_group_across_hosts(c, group, cluster.gpus_per_node)
                                 ? cluster.device.inter_gbps
                                 : cluster.device.intra_gbps;
    double wire = 0;
    for (const auto& [key, count] : bytes) {
      if (key.rfind(group + "/", 0) != 0) continue;
      const std::string op = key.substr(group.size() + 1);
      if (!only.empty() && op != only) continue;
      const double share = double(n - 1) / double(n);
      wire += double(count) * (op == "all_reduce" ? 2 * share
                               : op == "send"     ? 1.0
                               : op == "recv"     ? 0.0
                                                  : share);
    }
    return wire / (bandwidth * 1e9);
  };
  t.tp_s = T > 1 ? seconds("tp", T) : 0;
  t.pp_s = P > 1 ? seconds("pp", P) : 0;
  if (D > 1) {
    t.dp_s = seconds("dp", D);
    // Buckets reduce while the last micro-batch's backward runs; ZeRO-1's gather of the
    // updated weights follows the step, in full view.
    const double gather = seconds("dp", D, "all_gather");
    t.dp_exposed_s = std::max(0.0, t.dp_s - gather - t.backward_window_s) + gather;
  }
  return t;
}

bool plan_group_across_hosts(const TrainConfig& c, const std::string& group, int64_t per_node) {
  const int64_t T = c.layout.tensor, P = c.layout.pipeline, D = c.layout.data;
  int64_t stride = 1, size = 1;
  if (group == "tp") stride = 1, size = T;
  if (group == "dp") stride = T, size = D;
  if (group == "pp") stride = T * D, size = P;
  if (group == "embedding") stride = T * D * (P - 1), size = P > 1 ? 2 : 1;
  return size > 1 && stride * (size - 1) >= per_node;
}

std::string plan_report(const TrainConfig& c, const ClusterShape& cluster,
                        std::string* does_not_fit) {
  const int64_t T = c.layout.tensor, P = c.layout.pipeline, D = c.layout.data;
  std::ostringstream os;
  const int64_t ranks = T * P * D;
  os << "plan: " << parallel::describe(c.layout) << " on " << cluster.nodes << " node(s) x "
     << cluster.gpus_per_node << " " << cluster.device.name << " (" << ranks << " ranks)\n";
  // Memory: the rank of each stage (TP rank 0, DP rank 0); the largest decides the fit.
  PlanMemory worst;
  int worst_stage = 0;
  for (int pp = 0; pp < P; ++pp) {
    const PlanMemory m = plan_memory(c, {0, pp, 0});
    if (m.total() > worst.total()) worst = m, worst_stage = pp;
  }
  os << "memory per rank (stage " << worst_stage
     << ", the largest): " << format_bytes(worst.total()) << " of " << cluster.device.memory_gb
     << " GB (" << int(cluster.device.usable_fraction * 100) << "% usable)\n";
  const std::vector<std::pair<const char*, int64_t>> categories = {
      {"weights", worst.weights},
      {"main weights", worst.main_weights},
      {"gradients", worst.gradients},
      {"optimizer state", worst.optimizer},
      {"saved activations", worst.activations},
      {"teacher", worst.teacher}};
  for (const auto& [name, n] : categories)
    if (n > 0) os << "  " << name << ": " << format_bytes(n) << "\n";
  os << "  at the peak (" << (worst.peak_temporaries > 0 ? "in backward" : "end of forward")
     << "): saved activations " << format_bytes(worst.peak_activations) << ", gradients "
     << format_bytes(worst.peak_gradients) << ", backward temporaries "
     << format_bytes(worst.peak_temporaries) << "\n";
  if (c.runtime.kernels == KernelChoice::aten)
    os << "  (saved activations are modelled on Retort's own kernels; runtime.kernels=aten "
          "keeps more for backward)\n";
  os << "communication per step (rank 0; bytes as the communicators count them):\n";
  for (const auto& [key, n] : plan_communication(c, PlanRank{}, cluster.gpus_per_node)) {
    const std::string group = key.substr(0, key.find('/'));
    const char* link = group == "world"                                           ? "every link"
                       : plan_group_across_hosts(c, group, cluster.gpus_per_node) ? "across hosts"
                                                                                  : "within a host";
    os << "  " << key << ": " << format_bytes(n) << " (" << link << ")\n";
  }
  const PlanTime t = plan_time(c, cluster);
  const double tokens = double(c.training.global_batch * c.data.seq_len);
  char line[256];
  std::snprintf(line, sizeof(line),
                "time per step: %.3f s = compute %.3f + bubble %.3f + TP %.3f + PP %.3f + DP "
                "exposed %.3f (of %.3f); %.0f tokens/s\n",
                t.step_s(), t.compute_s, t.bubble_s, t.tp_s, t.pp_s, t.dp_exposed_s, t.dp_s,
                tokens / t.step_s());
  os << line;
  const double capacity = cluster.device.memory_gb * cluster.device.usable_fraction * 1e9;
  if (double(worst.total()) > capacity) {
    const auto largest = std::max_element(categories.begin(), categories.end(),
                                          [](auto& a, auto& b) { return a.second < b.second; });
    const std::string refusal =
        "--plan: the layout does not fit: stage " + std::to_string(worst_stage) + " needs " +
        format_bytes(worst.total()) + " per rank, the " + cluster.device.name + " has " +
        std::to_string(int(cluster.device.memory_gb)) + " GB (" +
        std::to_string(int(cluster.device.usable_fraction * 100)) +
        "% usable); the largest category is " + largest->first + " (" +
        format_bytes(largest->second) + ")";
    if (!does_not_fit) throw UserError(refusal);
    *does_not_fit = refusal;
  }
  return os.str();
}

namespace {

std::vector<int64_t> divisors_up_to(int64_t n, int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

}  // namespace

std::vector<PlanCandidate> plan_search(const Config& base, const ClusterShape& cluster) {
  const int64_t world = int64_t(cluster.nodes) * cluster.gpus_per_node;
  const TrainConfig shape = make_train_config(base, 1);  // the model's sizes, one rank
  std::vector<PlanCandidate> candidates;
  for (int64_t T : divisors_up_to(cluster.gpus_per_node, 8))
    for (int64_t P : divisors_up_to(shape.model.layers, 64)) {
      if (world % (T * P) != 0) continue;
      for (int zero : {0, 1})
        for (const char* recompute : {"none", "selective", "full"}) {
          PlanCandidate k;
          k.overrides = {"parallel.tensor=" + std::to_string(T),
                         "parallel.pipeline=" + std::to_string(P),
                         "parallel.data=auto",
                         std::string("parallel.sequence_parallel=") + (T > 1 ? "true" : "false"),
                         "parallel.pipeline_split=[]",
                         "optimizer.zero_stage=" + std::to_string(zero),
                         std::string("memory.activation_checkpointing=") + recompute};
          if (zero == 1 && world / (T * P) == 1) continue;  // ZeRO over one rank: the same
          Config config = base;
          try {
            for (const std::string& o : k.overrides) config.apply_override(o);
            const TrainConfig c = make_train_config(config, int(world));
            k.layout = parallel::describe(c.layout) + (zero ? " ZeRO-1" : "") + ", checkpointing " +
                       recompute;
            for (int pp = 0; pp < P; ++pp) {
              const PlanMemory m = plan_memory(c, {0, pp, 0});
              if (m.total() > k.memory.total()) k.memory = m;
            }
            k.time = plan_time(c, cluster);
            k.fits = double(k.memory.total()) <=
                     cluster.device.memory_gb * cluster.device.usable_fraction * 1e9;
            if (!k.fits) k.refusal = "needs " + format_bytes(k.memory.total()) + " per rank";
          } catch (const UserError& e) {
            k.layout = "TP" + std::to_string(T) + " x PP" + std::to_string(P) +
                       (zero ? " ZeRO-1" : "") + ", checkpointing " + recompute;
            k.refusal = e.what();
          }
          candidates.push_back(k);
        }
    }
  std::stable_sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.time.step_s() < b.time.step_s() : a.memory.total() < b.memory.total();
  });
  return candidates;
}

std::string plan_search_report(const Config& base, const ClusterShape& cluster, int shown,
                               bool* any_fits) {
  const std::vector<PlanCandidate> all = plan_search(base, cluster);
  if (any_fits) *any_fits = !all.empty() && all[0].fits;
  std::ostringstream os;
  const TrainConfig shape = make_train_config(base, 1);
  const double tokens = double(shape.training.global_batch * shape.data.seq_len);
  os << "search: " << all.size() << " layouts of " << cluster.nodes * cluster.gpus_per_node
     << " ranks (" << cluster.nodes << " x " << cluster.gpus_per_node << " " << cluster.device.name
     << ")\n";
  if (all.empty() || !all[0].fits) {
    os << "none fits in " << cluster.device.memory_gb << " GB; the smallest:\n";
  }
  char line[512];
  for (int i = 0; i < std::min<int>(shown, int(all.size())); ++i) {
    const PlanCandidate& k = all[size_t(i)];
    if (!k.fits && k.memory.total() == 0) continue;
    std::snprintf(line, sizeof(line),
                  "%s %-44s %9s/rank  step %8.3f s (compute %.3f, bubble %.3f, TP %.3f, PP "
                  "%.3f, DP exposed %.3f)  %8.0f tokens/s%s\n",
                  i == 0 && k.fits ? "recommended:" : "            ", k.layout.c_str(),
                  format_bytes(k.memory.total()).c_str(), k.time.step_s(), k.time.compute_s,
                  k.time.bubble_s, k.time.tp_s, k.time.pp_s, k.time.dp_exposed_s,
                  tokens / k.time.step_s(), k.fits ? "" : "  (does not fit)");
    os << line;
  }
  return os.str();
}

}  // namespace retort::engine
