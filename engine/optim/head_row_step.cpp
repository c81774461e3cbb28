// engine/optim/head_row_step.cpp: see head_row_step.h.
#include "engine/optim/head_row_step.h"

#include <algorithm>

namespace retort::engine {
namespace {

// `index` (built on the host) where `like` lives: through pinned memory without waiting on a
// GPU, as it is on the CPU.
torch::Tensor beside(const torch::Tensor& index, const torch::Tensor& like) {
  if (index.device() == like.device()) return index;
  return index.pin_memory().to(like.device(), /*non_blocking=*/true);
}

}  // namespace

HeadRowStepper::HeadRowStepper(layers::ParameterStore& store, AdamW* optimizer,
                               parallel::Communicator& dp, const HeadRowStepOptions& options)
    : store_(store), optimizer_(optimizer), dp_(dp), options_(options) {
  const torch::Tensor& weight = store_.all()[options_.index].value;
  // Reduce-only and summed on every rank: the whole gradient through shared memory when
  // every DP rank runs on this node.
  if (!optimizer_ && !options_.reduce_in_blocks && options_.owner < 0 && options_.shared_memory &&
      weight.device().is_cpu())
    shared_ = parallel::SharedReduction::create(dp_, {{weight.numel(), weight.scalar_type()}});
}

HeadRowStepper::~HeadRowStepper() = default;

void HeadRowStepper::begin_step(const std::vector<torch::Tensor>& tokens, double lr) {
  torch::NoGradGuard no_grad;
  lr_ = lr;
  square_ = torch::zeros(
      {}, torch::dtype(torch::kDouble).device(store_.all()[options_.index].value.device()));
  rows_streamed_ = blocks_reduced_ = 0;
  pending_ = true;
  delivered_ = false;
  blocks_.clear();
  const torch::Tensor& weight = store_.all()[options_.index].value;
  const int64_t local = weight.size(0);
  torch::Tensor reached = torch::zeros({local}, torch::kFloat);
  if (options_.tied_here) {
    for (const torch::Tensor& t : tokens) {
      torch::Tensor rows = t.reshape({-1}).to(torch::kLong) - options_.vocab_start;
      reached.index_fill_(0, rows.masked_select((rows >= 0) & (rows < local)), 1);
    }
    // Every DP rank steps the same rows from blocks, so the union over the group.
    if (dp_.size() > 1) dp_.all_reduce(reached, parallel::ReduceOp::Max);
  }
  touched_ = reached.nonzero().reshape({-1});
  position_ = torch::full({local}, -1, torch::kLong);
  position_.index_copy_(0, touched_, torch::arange(touched_.numel(), torch::kLong));
  // Built on the host from the host's tokens; they index the weight's rows where those live.
  position_on_host_ = position_;
  touched_ = beside(touched_, weight);
  position_ = beside(position_, weight);
  kept_ = torch::zeros({touched_.numel(), weight.size(1)}, weight.options());
  earlier_ = torch::Tensor();
}

int64_t HeadRowStepper::block_rows(int64_t rows) const {
  const int64_t width = store_.all()[options_.index].value.size(1);
  return std::max<int64_t>(1, std::min(options_.block_elements / width, (rows + 7) / 8));
}

void HeadRowStepper::take_rows(int64_t row_begin, torch::Tensor grad) {
  torch::NoGradGuard no_grad;
  delivered_ = true;
  layers::Parameter& p = store_.all()[options_.index];
  const int64_t rows = grad.size(0);
  const torch::Tensor& accumulated = p.value.grad();  // earlier micro-batches of the step
  // Which rows of the block are kept, found on the host (no wait for the device), then
  // placed with the gradient.
  const torch::Tensor positions = position_on_host_.narrow(0, row_begin, rows);
  const torch::Tensor kept_on_host = (positions >= 0).nonzero().reshape({-1});  // block-relative
  const torch::Tensor kept_rows = beside(kept_on_host, grad);
  if (kept_rows.numel() > 0) {
    // Their gradient is not final yet: the lookup's rows add to this micro-batch's part
    // before earlier micro-batches' sum does, as autograd would add them.
    const torch::Tensor where = beside(positions.index_select(0, kept_on_host), grad);
    kept_.index_copy_(0, where, grad.index_select(0, kept_rows));
    grad.index_fill_(0, kept_rows, 0);
    if (accumulated.defined()) {
      if (!earlier_.defined()) earlier_ = torch::zeros_like(kept_);
      earlier_.index_copy_(0, where,
                           accumulated.narrow(0, row_begin, rows).index_select(0, kept_rows));
    }
  }
  if (accumulated.defined()) grad.add_(accumulated.narrow(0, row_begin, rows));
  if (kept_rows.numel() > 0) grad.index_fill_(0, kept_rows, 0);
  if (optimizer_) {
    reduce(grad);
    if (owns()) {
      square_ += grad.square().sum().to(torch::kDouble);
      optimizer_->step_rows(options_.index, row_begin, grad, lr_, kept_rows);
    }
  } else {
    launch_block(row_begin, grad);
  }
  rows_streamed_ += rows - kept_rows.numel();
  // The last block: what earlier micro-batches accumulated has been used; the lookup's
  // gradient lands alone.
  if (row_begin + rows == p.value.size(0) && accumulated.defined()) p.value.mutable_grad().reset();
}

torch::Tensor HeadRowStepper::whole_gradient_memory() {
  // Free to write until this step's sum starts: the last step's finished in complete().
  if (!shared_ || !blocks_.empty()) return {};
  return shared_->region(0).view_as(store_.all()[options_.index].value);
}

void HeadRowStepper::complete() {
  if (!pending_) return;
  pending_ = false;
  torch::NoGradGuard no_grad;
  layers::Parameter& p = store_.all()[options_.index];
  const torch::Tensor& lookup = p.value.grad();
  if (!optimizer_) {
    complete_reduced(lookup);
    return;
  }
  if (!delivered_) {  // no fused head formed blocks (unfused, or no head loss): all at once
    if (lookup.defined()) {
      torch::Tensor whole = lookup.is_sparse() ? lookup.to_dense() : lookup.contiguous();
      p.value.mutable_grad().reset();
      reduce(whole);
      if (owns()) {
        square_ += whole.square().sum().to(torch::kDouble);
        optimizer_->step_rows(options_.index, 0, whole, lr_);
      }
    }
    return;
  }
  add_lookup_rows(lookup);
  p.value.mutable_grad().reset();
  if (touched_.numel() == 0) return;
  reduce(kept_);
  if (owns()) {
    square_ += kept_.square().sum().to(torch::kDouble);
    optimizer_->step_row_list(options_.index, touched_, kept_, lr_);
  }
  kept_ = torch::Tensor();
}

void HeadRowStepper::add_lookup_rows(const torch::Tensor& lookup) {
  if (lookup.defined()) {
    if (lookup.is_sparse()) {  // one row per token, added in order as a dense sum would
      const torch::Tensor where = position_.index_select(0, lookup._indices().reshape({-1}));
      // Entries outside the kept rows (-1) are the zero rows of tokens another TP rank holds:
      // added as zeros to row 0, which leaves it exactly as it is, with no wait for the device
      // to count the valid ones.
      const torch::Tensor values = lookup._values();
      if (kept_.size(0) > 0)
        kept_.index_add_(
            0, where.clamp_min(0),
            torch::where((where >= 0).unsqueeze(1), values, torch::zeros({}, values.options())));
    } else {
      kept_.add_(lookup.index_select(0, touched_));
    }
  }
  if (earlier_.defined()) kept_.add_(earlier_);
  earlier_ = torch::Tensor();
}

void HeadRowStepper::launch_block(int64_t row_begin, const torch::Tensor& grad) {
  PendingBlock block{row_begin, grad.reshape({-1}), torch::Tensor(), parallel::Handle()};
  if (shared_ && block.sent.numel() == store_.all()[options_.index].value.numel()) {
    block.shared = true;  // the whole gradient (streams() is false): the one slot
    shared_->start(0, {block.sent});
  } else if (options_.owner < 0) {
    block.result = block.sent;  // summed in place
    block.handle = dp_.all_reduce_async(block.sent);
  } else {
    std::vector<int64_t> counts(dp_.size(), 0);
    counts[options_.owner] = block.sent.numel();
    block.result = torch::empty({counts[dp_.rank()]}, grad.options());
    block.handle = dp_.reduce_scatter_v_async(block.sent, block.result, counts);
  }
  blocks_.push_back(std::move(block));
  ++blocks_reduced_;
}

void HeadRowStepper::progress() {
  if (shared_) shared_->progress();
  for (PendingBlock& block : blocks_)
    if (block.handle.pending()) block.handle.test();
}

void HeadRowStepper::complete_reduced(const torch::Tensor& lookup) {
  layers::Parameter& p = store_.all()[options_.index];
  if (!delivered_) {  // no fused head formed blocks: the whole gradient at once
    torch::Tensor whole;
    if (lookup.defined()) whole = lookup.is_sparse() ? lookup.to_dense() : lookup.contiguous();
    p.value.mutable_grad().reset();
    if (!whole.defined()) return;
    reduce(whole);
    if (owns()) p.value.mutable_grad() = whole;
    return;
  }
  torch::Tensor reduced;  // on ranks that step
  const bool one_block = blocks_.size() == 1 && blocks_[0].sent.numel() == p.value.numel();
  if (owns()) reduced = one_block ? torch::Tensor() : torch::empty_like(p.value);
  for (PendingBlock& block : blocks_) {
    if (block.shared) {  // the sum stays in the shared region; .grad() becomes a view of it
      shared_->finish(0);
      block.result = shared_->region(0);
    }
    block.handle.wait();
    if (!owns()) continue;
    if (one_block) {
      reduced = block.result.view_as(p.value);
    } else {
      reduced.view({-1})
          .narrow(0, block.row_begin * p.value.size(1), block.result.numel())
          .copy_(block.result);
    }
  }
  blocks_.clear();
  add_lookup_rows(lookup);
  p.value.mutable_grad().reset();
  if (touched_.numel() > 0) {
    reduce(kept_);
    if (owns()) reduced.index_copy_(0, touched_, kept_);
  }
  kept_ = torch::Tensor();
  if (owns())
    p.value.mutable_grad() = reduced;
  else
    p.value.mutable_grad().reset();
}

void HeadRowStepper::reduce(torch::Tensor& grad) {
  if (dp_.size() == 1) return;
  if (options_.owner < 0) {
    dp_.all_reduce(grad);
    return;
  }
  std::vector<int64_t> counts(dp_.size(), 0);
  counts[options_.owner] = grad.numel();
  torch::Tensor mine = torch::empty({counts[dp_.rank()]}, grad.options());
  dp_.reduce_scatter_v_async(grad.reshape({-1}), mine, counts).wait();
  if (owns()) grad.view({-1}).copy_(mine);
}

}  // namespace retort::engine
