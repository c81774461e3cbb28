// engine/optim/head_row_step.h: optimizer-in-backward for the LM head weight, block of
// vocabulary rows by block as the fused head's backward forms its gradient (a
// layers::HeadGradSink), so the [vocab, hidden] gradient never exists whole. Each block is
// summed over DP (an all-reduce, or under ZeRO-1 a reduction to the weight's owner) and
// stepped at once, with what earlier micro-batches accumulated in .grad() added first.
// When the weight is tied to the embedding on this stage, the rows the lookup reaches (the
// step's input tokens: a union over micro-batches and DP ranks, known before backward) are
// final only once the lookup's row-sparse gradient has added in at the end of backward: those
// rows are kept aside, completed then (complete(), from the weight's grad-ready hook) and
// stepped together. Every row steps exactly once per step, with the gradient of plain
// training. A step whose head delivered no blocks (the unfused head, or no loss on the head)
// steps the whole gradient at complete().
// Without an optimizer (reduce-only, for data parallelism when the optimizer steps after
// backward) nothing steps: the head's gradient is taken whole (formed in forward), and its
// DP reduction, rows kept aside excepted, runs non-blocking while the rest of backward does;
// complete() reduces the kept rows as above and leaves the whole reduced gradient in .grad()
// (on the owner under ZeRO-1) for the usual clip and step. The additions are those of the
// stepping form, so the two modes give bitwise the same gradient. With reduce_in_blocks the
// reduce-only form takes the blocks as the stepping form does (the head forms its logits again
// in backward) and starts each block's sum as it arrives: the sum then overlaps the head's own
// backward as well as the rest, which pays where the DP link is slow. Without this the
// tied weight's gradient, the largest of the model, would be final only at the very end of
// backward and its whole reduction would wait on the critical path.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "engine/optim/adamw.h"
#include "layers/head_grad_sink.h"
#include "parallel/communicator.h"
#include "parallel/shared_reduction.h"

namespace retort::engine {

struct HeadRowStepOptions {
  size_t index = 0;                  // the weight in the parameter store
  bool tied_here = false;            // the embedding lookup on this stage uses the same weight
  int64_t vocab_start = 0;           // this TP rank's first row in the whole vocabulary
  int owner = -1;                    // ZeRO-1: the DP rank that steps the weight; -1 = every rank
  int64_t block_elements = 1 << 21;  // rows per block: this many elements, at most an 8th
  bool shared_memory = true;         // reduce-only DP sum through shared memory when it can
  // Reduce-only: take the gradient in blocks formed in backward, each block's DP sum (over
  // MPI) started as it arrives, instead of whole as soon as backward begins.
  bool reduce_in_blocks = false;
};

class HeadRowStepper : public layers::HeadGradSink {
 public:
  // optimizer null: reduce-only (see above).
  HeadRowStepper(layers::ParameterStore& store, AdamW* optimizer, parallel::Communicator& dp,
                 const HeadRowStepOptions& options);
  ~HeadRowStepper();

  // Before the step's forwards: the input tokens of every micro-batch on this rank, and the
  // step's learning rate.
  void begin_step(const std::vector<torch::Tensor>& tokens, double lr);
  int64_t block_rows(int64_t rows) const override;
  // Reduce-only takes the gradient whole (formed in forward, no second pass over the logits),
  // unless reduce_in_blocks.
  bool streams() const override { return optimizer_ != nullptr || options_.reduce_in_blocks; }
  void take_rows(int64_t row_begin, torch::Tensor grad) override;
  // Reduce-only through shared memory: this rank's region of the sum, so the head forms the
  // gradient where the sum reads it (no copy at take_rows).
  torch::Tensor whole_gradient_memory() override;
  // The lookup's rows have arrived (or backward is over): the kept rows step. Idempotent.
  void complete();
  // Reduce-only: drives the pending block reductions (call while backward runs).
  void progress();
  // The squared norm of the weight's final gradient this step (float64, on its device);
  // undefined where this rank does not step it.
  torch::Tensor grad_square() const { return owns() ? square_ : torch::Tensor(); }
  size_t index() const { return options_.index; }
  // Bytes of this rank's shared-memory segment for the reduce-only sum (0 without one).
  int64_t shared_bytes() const { return shared_ ? shared_->segment_bytes() : 0; }
  // Gradient bytes copied into it so far (none when the head formed the gradient there).
  int64_t shared_bytes_copied_in() const { return shared_ ? shared_->bytes_copied_in() : 0; }
  // Rows stepped from blocks and rows kept for complete() in the last step (for tests).
  int64_t rows_streamed() const { return rows_streamed_; }
  int64_t rows_kept() const { return touched_.numel(); }
  // Reduce-only: DP sums launched for the head's blocks in the last step.
  int64_t blocks_reduced() const { return blocks_reduced_; }

 private:
  bool owns() const { return options_.owner < 0 || options_.owner == dp_.rank(); }
  // The DP sum of grad, on the ranks that step (in place on them).
  void reduce(torch::Tensor& grad);
  // The lookup's gradient (and earlier micro-batches' sum) of the kept rows, into kept_.
  void add_lookup_rows(const torch::Tensor& lookup);
  // Reduce-only: launches the DP sum of rows [row_begin, ...) into reduced_.
  void launch_block(int64_t row_begin, const torch::Tensor& grad);
  // Reduce-only complete(): the blocks waited for, the kept rows reduced, .grad() set.
  void complete_reduced(const torch::Tensor& lookup);

  struct PendingBlock {
    int64_t row_begin;
    torch::Tensor sent, result;  // kept alive until the reduction completes
    parallel::Handle handle;
    bool shared = false;  // summed through shared_, not MPI
  };

  layers::ParameterStore& store_;
  AdamW* optimizer_;  // null: reduce-only
  parallel::Communicator& dp_;
  HeadRowStepOptions options_;
  double lr_ = 0;
  torch::Tensor square_;    // float64 scalar on the weight's device
  bool pending_ = false;    // begun, not completed
  bool delivered_ = false;  // the head delivered blocks this step
  int64_t rows_streamed_ = 0, blocks_reduced_ = 0;
  torch::Tensor touched_;             // sorted local rows the lookup reaches (int64)
  torch::Tensor position_;            // per local row: its place in touched_, or -1
  torch::Tensor position_on_host_;    // the same on the host, for the per-block bookkeeping
  torch::Tensor kept_;                // [touched, h]: the head's gradient of those rows
  torch::Tensor earlier_;             // [touched, h]: their sum over earlier micro-batches, if any
  std::vector<PendingBlock> blocks_;  // reduce-only: launched block reductions
  std::unique_ptr<parallel::SharedReduction> shared_;  // the whole gradient's slot, or null
};

}  // namespace retort::engine
