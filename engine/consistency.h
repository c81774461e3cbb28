// engine/consistency.h: the gradient-consistency suite. The same short training runs under
// several layouts (TP1, TP2, STP2, DP2, TP2xDP2, PP2, PP2xSTP2xDP2, ...), each on a subset of
// the world's ranks; per step it records the loss, every parameter gradient gathered to
// global shape (from every pipeline stage) and the capture-point activations of the first
// samples, writes them to <out>/<layout>.h5 and compares every layout with the first (the
// reference, TP1).
#pragma once
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "engine/config.h"

namespace retort::engine {

struct ConsistencyLayout {
  std::string name;  // e.g. "PP2xSTP2xDP2"
  int tensor = 1, data = 1, pipeline = 1;
  std::vector<int64_t> pipeline_split;  // layers per stage; empty = even
  bool sequence_parallel = false;
  int zero_stage = 0;  // "-Z1": AdamW state sharded over DP
  int ranks() const { return tensor * data * pipeline; }
  std::string file_name() const;  // the name with ':' replaced
};

// Parses layouts made of "PPn" (optionally "PPn:a-b-..." with the layers per stage), "TPn" or
// "STPn", and "DPn", joined by 'x' ("TP2xDP2", "PP4:1-2-1-1", "PP2xSTP2xDP2"), optionally
// suffixed "-Z1" (ZeRO-1); throws UserError otherwise.
ConsistencyLayout parse_consistency_layout(const std::string& name);

struct ConsistencyTolerances {
  double loss = 1e-5;        // relative, every step (also the global gradient norm)
  double gradient = 1e-4;    // ||g - g_ref|| / ||g_ref||, step 1
  double activation = 1e-4;  // same measure, step 1
};

// What one layout recorded (on its first rank).
struct LayoutRecord {
  std::vector<double> losses;                                           // per step
  std::vector<double> grad_norms;                                       // per step, before clipping
  std::map<int64_t, std::map<std::string, torch::Tensor>> gradients;    // step -> name -> global
  std::map<int64_t, std::map<std::string, torch::Tensor>> activations;  // step -> name -> global
};

// Runs one layout on the ranks of `world` whose rank < layout.ranks(); the others return
// at once. `base` is the config; micro_batch is set so every layout accumulates
// `accumulation` micro-batches per step. The record is filled on world rank 0.
void run_consistency_layout(const Config& base, const ConsistencyLayout& layout,
                            int64_t accumulation, int64_t compare_samples, MPI_Comm world,
                            LayoutRecord* record);

void write_record(const std::string& path, const LayoutRecord& record);

struct ComparisonRow {
  std::string layout;
  double loss = 0, grad_norm = 0, gradient = 0, activation = 0;  // worst relative differences
  std::string worst_gradient, worst_activation;                  // where they occur
  bool ok = true;
};

ComparisonRow compare_records(const std::string& name, const LayoutRecord& reference,
                              const LayoutRecord& other, const ConsistencyTolerances& tol);
std::string format_comparison_table(const std::vector<ComparisonRow>& rows,
                                    const ConsistencyTolerances& tol);

}  // namespace retort::engine
