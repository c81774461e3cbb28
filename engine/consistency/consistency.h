// engine/consistency/consistency.h: the gradient-consistency suite. The same short training runs
// under several layouts (TP1, TP2, STP2, DP2, TP2xDP2, PP2, PP2xSTP2xDP2, ...), each on a subset of
// the world's ranks. Per step it records the loss and each loss term, the gradient norm,
// every trainable parameter's gradient gathered to global shape (from every pipeline stage),
// the student's and the teacher's capture-point activations of every micro-batch on every
// DP rank, and whether replicated parameters stayed bitwise equal; writes them to
// <out>/<layout>.h5 and compares every layout with the first (the reference, TP1).
#pragma once
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/config/train_config.h"

namespace retort::engine {

struct ConsistencyLayout {
  std::string name;  // e.g. "PP2xSTP2xDP2"
  int tensor = 1, data = 1, pipeline = 1;
  std::vector<int64_t> pipeline_split;  // layers per stage; empty = even
  bool sequence_parallel = false;
  int zero_stage = 0;  // "-Z1": AdamW state sharded over DP
  std::string device;  // "@cpu", "@cuda": runtime.device for this layout; empty: the config's
  int ranks() const { return tensor * data * pipeline; }
  std::string file_name() const;  // the name with ':' replaced
};

// Parses layouts made of "PPn" (optionally "PPn:a-b-..." with the layers per stage), "TPn" or
// "STPn", and "DPn", joined by 'x' ("TP2xDP2", "PP4:1-2-1-1", "PP2xSTP2xDP2"), optionally
// suffixed "-Z1" (ZeRO-1), then "@cpu" or "@cuda" (the device of this layout alone: a GPU
// run checked against the CPU's, "TP1@cpu,TP1,TP2"); throws UserError otherwise.
ConsistencyLayout parse_consistency_layout(const std::string& name);

struct ConsistencyTolerances {
  double loss = 1e-5;        // relative, every step: the loss, each term, the gradient norm
  double gradient = 1e-4;    // ||g - g_ref|| / ||g_ref||, every parameter, every step
  double activation = 1e-4;  // same measure, every capture point, every step
  // Gradients measured as ||g - g_ref|| / ||g_ref - g_ref(float64)||, divided by
  // bf16_gradient_bound(elements); `gradient` is then 1.
  bool gradient_in_rounding_units = false;
};
// fp32 runs keep the tolerances above; float64 runs are held to 1e-10 and 1e-9. bfloat16 runs
// get tolerances derived from bf16's unit round-off u = 2^-8 for a model of `layers` blocks and
// `tokens` target tokens per step (docs/numerics.md, "Tolerances in bf16, derived"): layouts round
// at different points, R = 10 layers + 3 roundings on the forward path, each a relative error
// uniform in [-u, u] (variance u^2 / 3), independent, passed on without gain by normalised
// residual blocks; two runs then differ norm-wise by sigma = u sqrt(2 R / 3). Activations are
// held to 4 sigma, gradients (twice the roundings: forward and backward) to 4 u sqrt(4 R / 3),
// and the loss, terms and gradient norm, sums over the step's tokens of independent per-token
// differences, to 4 sigma / sqrt(tokens).
ConsistencyTolerances tolerances_for(const std::string& dtype, int64_t layers = 0,
                                     int64_t tokens = 1);
// bf16 against a float64 run of the reference as well: each gradient's difference from the
// reference in units of the reference's own rounding error, ||g_ref - g_ref(float64)||. With
// the layout's and the reference's errors independent and the layout rounding at most twice as
// often, the expected ratio is at most sqrt(1 + 2); the ratio of two norms of n-element
// errors has a logarithm of standard deviation about 1/sqrt(n), held to 5 of them:
// bound(n) = sqrt(3) exp(5 / sqrt(n)). A gradient that is zero in exact arithmetic (the key
// bias) is rounding noise on both sides and is measured the same way. The loss, terms and
// activations keep tolerances_for's.
ConsistencyTolerances tolerances_against_float64(const std::string& dtype, int64_t layers = 0,
                                                 int64_t tokens = 1);
double bf16_gradient_bound(int64_t elements);

// What one layout recorded in one step (on its first rank), everything at global shape.
struct StepRecord {
  double loss = 0, grad_norm = 0;                  // grad norm before clipping
  std::map<std::string, double> terms;             // lm, logit, activation, activation.<pair>
  std::map<std::string, torch::Tensor> gradients;  // every trainable parameter, double
  // "student/<capture>" and "teacher/<capture>": [global_batch, seq, hidden], every
  // micro-batch of every DP rank at its place in the global batch (NaN where none arrived).
  std::map<std::string, torch::Tensor> activations;
};

struct LayoutRecord {
  std::vector<StepRecord> steps;
  std::vector<std::string> replica_violations;  // "step 2: TP replicas of ... differ"
  std::string transport;  // how the layout's world group moved tensors (transport_name)
  std::string dp_sum;     // how the DP gradient sum ran (GradientSync::describe_dp_sum), if DP
};

// The training config of one layout: `base` with the layout's parallel keys, and micro_batch
// set so that it accumulates `accumulation` micro-batches per step. Bad input (a split that
// does not fit the model, a batch that does not divide) is a UserError here.
TrainConfig consistency_train_config(const Config& base, const ConsistencyLayout& layout,
                                     int64_t accumulation);

// Runs one layout on the ranks of `world` whose rank < layout.ranks(); the others return
// at once. `base` is the config; micro_batch is set so every layout accumulates
// `accumulation` micro-batches per step. The record is filled on world rank 0.
void run_consistency_layout(const Config& base, const ConsistencyLayout& layout,
                            int64_t accumulation, MPI_Comm world, LayoutRecord* record);

void write_record(const std::string& path, const LayoutRecord& record);

struct ComparisonRow {
  std::string layout;
  // Worst relative differences over every step, and where they occur ("name @ step n").
  double loss = 0, grad_norm = 0, terms = 0, gradient = 0, activation = 0;
  std::string worst_term, worst_gradient, worst_activation;
  int64_t replica_violations = 0;
  std::vector<std::string> failures;  // one line per failed check
  bool ok() const { return failures.empty(); }
};

// The checks a record must pass on its own (the reference's row): no NaN anywhere, no
// trainable parameter whose gradient is exactly zero, no replica that drifted.
ComparisonRow check_reference(const std::string& name, const LayoutRecord& reference);
// `other` against the reference: every step's loss, terms, gradient norm, gradients and
// activations within the tolerances, the same names on both sides, and its own replicas.
// The gradient norm is held to `norm_tolerance` (the loss's by default).
ComparisonRow compare_records(const std::string& name, const LayoutRecord& reference,
                              const LayoutRecord& other, const ConsistencyTolerances& tol,
                              double norm_tolerance = -1,
                              const LayoutRecord* float64_reference = nullptr);
// --exact's tolerance for the gradient norm: a float32 sum of squares in another order.
constexpr double kExactGradientNorm = 1e-6;
// The table, then each failure (at most `max_failures` lines per layout).
std::string format_comparison_table(const std::vector<ComparisonRow>& rows,
                                    const ConsistencyTolerances& tol, size_t max_failures = 12);

}  // namespace retort::engine
