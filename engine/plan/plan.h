// engine/plan/plan.h: the planner behind `engine_train CONFIG --plan`: what a run will need
// and move before it runs. From the resolved config alone (no torch, no MPI) it predicts,
// per rank:
//  - parameters held (each pipeline stage's layers, sharded over TP as the layers shard them:
//    vocabulary padded, kv heads replicated when fewer than the TP ranks);
//  - bytes each group's communicator counts in one optimizer step, by group and operation,
//    with the counting rules of parallel/communicator.h (all-gather: the gathered size;
//    reduce-scatter: the full input; all-reduce, send, receive: the message);
//  - memory by category, and a step time from a device table (FLOP rate, link bandwidths).
// The byte counts follow the engine's own step exactly for LM training with the default
// head (tests/mpi/plan_comm_test.cpp checks them against the counters on every rank); for
// distillation, optimizer-in-backward and the streamed head they are estimates (flagged).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/config/train_config.h"

namespace retort::engine {

// Where a rank sits in the layout (parallel/mesh.h's coordinates; no MPI here).
struct PlanRank {
  int tp = 0, pp = 0, dp = 0;
};

// Elements of the parameters one rank holds, trainable ones apart.
struct PlanParameters {
  int64_t held = 0, trainable = 0;
  int64_t tied_embedding = 0;   // of those, the tied embedding's shard (0 if untied or no PP)
  int64_t partial_over_tp = 0;  // replicated over TP with partial gradients (summed over TP)
};
PlanParameters plan_parameters(const TrainConfig& config, const PlanRank& rank);

// Bytes per optimizer step by "group/operation" ("tp/all_reduce", "pp/send", "dp/all_gather",
// "embedding/all_reduce", "world/all_reduce"), as that rank's communicators count them.
// `ranks_per_host`: ranks started on each host (0: all on one), which decides whether the DP
// sum runs in shared memory (float32 always) or over MPI (in parallel.dp_reduce_dtype).
std::map<std::string, int64_t> plan_communication(const TrainConfig& config, const PlanRank& rank,
                                                  int64_t ranks_per_host = 0);
// Whether the DP gradient sum runs through shared memory (parallel/shared_reduction.h): on
// CPU ranks, without ZeRO-1, with parallel.dp_shared_memory, and two or more DP ranks (the
// same number) on each host.
bool plan_dp_in_shared_memory(const TrainConfig& config, int64_t ranks_per_host);

// A device kind: compute rate and links, for the time and fit predictions. Values are
// nominal datasheet figures; every one can be overridden on the command line.
struct DeviceKind {
  std::string name;
  double tflops = 0;        // dense rate of the run's compute dtype, per rank
  double efficiency = 0.4;  // fraction of it a training step reaches (MFU)
  double memory_gb = 0;     // per rank
  // The share of it a plan may fill: the rest is for the CUDA context, the communication
  // library's buffers, workspaces and the allocator's fragmentation.
  double usable_fraction = 0.9;
  double intra_gbps = 0;  // GB/s per rank within a host (NVLink, shared memory)
  double inter_gbps = 0;  // GB/s per rank across hosts (InfiniBand, Ethernet)
  double inter_latency_us = 0;
};
// "h100", "a100" or "cpu"; throws UserError naming the kinds otherwise.
DeviceKind device_kind(const std::string& name);

struct ClusterShape {
  int nodes = 1, gpus_per_node = 1;
  DeviceKind device;
};

// Bytes per rank by category, and the peak. Gradient buffers exist from a step's first
// backward until its optimizer step, and saved activations fall as backward runs, so the
// peak is not the sum of the categories' sizes: it is the larger of the end of the last
// forward before a backward, and the stage's last block's MLP backward (its gradients beside
// the activations still saved).
struct PlanMemory {
  int64_t weights = 0;       // compute copies (bf16 under mixed precision; else the main)
  int64_t main_weights = 0;  // fp32 main weights under mixed precision (else 0)
  int64_t gradients = 0;     // fp32 (or float64) accumulation buffers
  int64_t optimizer = 0;     // AdamW's two moments (this rank's share under ZeRO-1)
  int64_t activations = 0;   // saved for backward, for the checkpointing mode (their peak)
  int64_t teacher = 0;       // teacher weights (bf16 under mixed precision) and its captures
  // At the peak: saved activations, gradient buffers, and backward's temporaries (the MLP's
  // incoming gradient and its two inner gradients).
  int64_t peak_activations = 0, peak_gradients = 0, peak_temporaries = 0;
  int64_t total() const {
    return weights + main_weights + optimizer + teacher + peak_activations + peak_gradients +
           peak_temporaries;
  }
};
PlanMemory plan_memory(const TrainConfig& config, const PlanRank& rank);

struct PlanTime {
  double compute_s = 0, bubble_s = 0, tp_s = 0, pp_s = 0, dp_s = 0, dp_exposed_s = 0;
  double backward_window_s = 0;  // the last micro-batch's backward, which DP sums overlap
  double step_s() const { return compute_s + bubble_s + tp_s + pp_s + dp_exposed_s; }
};
PlanTime plan_time(const TrainConfig& config, const ClusterShape& cluster);

// Whether rank 0's group of this kind ("tp", "pp", "dp", "embedding") spans hosts of
// `per_node` consecutive ranks (Megatron's order: TP fastest, then DP, then PP).
bool plan_group_across_hosts(const TrainConfig& config, const std::string& group, int64_t per_node);

// The report --plan prints: memory by category (the largest rank's), bytes per step by group
// and link kind, predicted step time and tokens/s. Throws UserError when a rank's memory
// exceeds the device's, naming the category that overflows; with `does_not_fit`, returns the
// report and leaves that one line there instead ("" when it fits).
std::string plan_report(const TrainConfig& config, const ClusterShape& cluster,
                        std::string* does_not_fit = nullptr);

// A layout the search tried: its overrides and, if it fits, its predicted step.
struct PlanCandidate {
  std::vector<std::string> overrides;  // parallel.*, optimizer.zero_stage, memory.*
  std::string layout;                  // as the banner writes it, with ZeRO and checkpointing
  bool fits = false;
  std::string refusal;  // why it does not fit or cannot run
  PlanMemory memory;    // the largest rank's
  PlanTime time;
};
// Every layout of the cluster's ranks the config admits (TP within a host, dividing the
// heads; PP dividing the layers; DP the rest; ZeRO-1 off and on; the three checkpointing
// modes), fitting ones first by predicted step time, then the rest.
std::vector<PlanCandidate> plan_search(const Config& config, const ClusterShape& cluster);
// The search's report: the recommended layout, why, and the runners-up; *any_fits (if given)
// tells whether any layout fits.
std::string plan_search_report(const Config& config, const ClusterShape& cluster, int shown = 6,
                               bool* any_fits = nullptr);

}  // namespace retort::engine
