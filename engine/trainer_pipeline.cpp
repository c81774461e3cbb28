// engine/trainer_pipeline.cpp: the trainer's step under pipeline parallelism. Each stage
// runs its layers on every micro-batch in 1F1B order (parallel::run_one_forward_one_backward).
// What travels forward is the student's hidden state [b, s (/tp under STP), h], followed along
// the last dimension by the teacher's when distilling; what travels backward is the gradient
// of the student's part. A stage keeps, per micro-batch in flight, only its input (a leaf
// that receives the gradient to send back) and the autograd edges of its output and of its
// own loss part; the output tensor itself is dropped once sent. Each stage adds its part of
// the loss: the activation losses of the pairs whose student layer it runs and, on the last
// stage, the LM and logit losses.
#include <torch/csrc/autograd/engine.h>

#include <chrono>

#include "engine/trainer.h"
#include "parallel/pipeline_runner.h"

namespace retort::engine {
namespace {

// What a stage keeps of a micro-batch between its forward and its backward.
struct InFlight {
  torch::Tensor input;                // the received hidden state (a leaf); undefined on stage 0
  torch::autograd::Edge output_edge;  // where the output's gradient enters the graph
  torch::autograd::Edge loss_edge;    // the same for this stage's loss part
  torch::Tensor loss_seed;            // d(loss)/d(loss part) = 1, in the loss's dtype
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Wraps a stage callback so its running time is added to `busy`.
template <typename Callback>
auto timed(Callback callback, double& busy) {
  return [callback, &busy](int m, const torch::Tensor& t) {
    const Clock::time_point start = Clock::now();
    torch::Tensor out = callback(m, t);
    busy += seconds_since(start);
    return out;
  };
}

torch::autograd::Edge edge_of(const torch::Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  return torch::autograd::impl::gradient_edge(t);
}

}  // namespace

double Trainer::pipeline_micro_batches(const std::vector<TokenBatch>& micro,
                                       const std::vector<int64_t>& first_samples,
                                       double target_count) {
  const int64_t batch = config_.training.micro_batch, seq = config_.data.seq_len;
  const int64_t local_seq = tp_.sequence_parallel ? seq / tp_.size() : seq;
  const int64_t student_width = config_.model.hidden;
  const bool teacher_travels = distiller_ && distiller_->needs_teacher();
  const int64_t teacher_width = teacher_travels ? teacher_->config().hidden : 0;
  const int64_t step = progress_.step + 1;
  const int micro_batches = int(micro.size());
  std::vector<InFlight> in_flight(micro.size());
  double loss_value = 0;

  parallel::PipelineStage stage;
  stage.activation_shape = {batch, local_seq, student_width + teacher_width};
  stage.gradient_shape = {batch, local_seq, student_width};
  stage.dtype = dtype_;
  stage.forward = [&](int m, const torch::Tensor& received) -> torch::Tensor {
    const TokenBatch& b = micro[m];
    torch::Tensor tokens = to_tensor(b.inputs, b.batch), targets = to_tensor(b.targets, b.batch);
    InFlight& f = in_flight[m];
    torch::Tensor x, t;
    if (stage_.embedding) {
      x = model_->embed(tokens);
      if (teacher_travels) t = teacher_->embed(tokens);
    } else {
      f.input = (teacher_travels ? received.narrow(2, 0, student_width).contiguous() : received)
                    .requires_grad_(true);
      x = f.input;
      if (teacher_travels) t = received.narrow(2, student_width, teacher_width).contiguous();
    }
    layers::CaptureSink sink(wanted_captures()), teacher_sink(wanted_teacher_captures());
    x = model_->run_blocks(x, seq, sink.wants_any() ? &sink : nullptr);
    if (teacher_travels) t = teacher_->run_blocks(t, seq, &teacher_sink);
    // Before the activation losses take (and free) the teacher's captures.
    if (inspecting_captures()) inspector_->on_captures(step, first_samples[m], sink, teacher_sink);

    torch::Tensor loss;  // this stage's part of the micro-batch's loss
    if (distiller_)
      loss = distiller_->activation_loss(targets, sink, teacher_sink, target_count, &step_terms_);
    if (stage_.head) {
      torch::Tensor head;
      if (!distiller_) {
        head = model_->head_loss_sum(x, targets) / target_count;
      } else {
        torch::Tensor teacher_logits =
            distiller_->needs_teacher_logits() ? teacher_->head_logits(t) : torch::Tensor();
        head = distiller_->output_loss(model_->head_logits(x), teacher_logits, targets,
                                       target_count, config_.model.vocab_size, &step_terms_);
      }
      loss = loss.defined() ? loss + head : head;
    }
    if (loss.defined()) {
      loss_value += loss.item<double>();
      f.loss_edge = edge_of(loss);
      f.loss_seed = torch::ones({}, loss.options());
    }
    if (stage_.head) return {};
    f.output_edge = edge_of(x);
    return teacher_travels ? torch::cat({x.detach(), t}, 2) : x.detach();
  };
  stage.backward = [&](int m, const torch::Tensor& output_grad) -> torch::Tensor {
    // The last micro-batch's backward launches the DP buckets as gradients become ready.
    if (dp_sync_ && m + 1 == micro_batches) dp_sync_->arm();
    InFlight f = std::move(in_flight[m]);
    torch::autograd::edge_list roots;
    std::vector<torch::Tensor> seeds;
    if (f.output_edge.is_valid()) {
      roots.push_back(f.output_edge);
      seeds.push_back(output_grad);
    }
    if (f.loss_edge.is_valid()) {
      roots.push_back(f.loss_edge);
      seeds.push_back(f.loss_seed);
    }
    if (!roots.empty())
      torch::autograd::Engine::get_default_engine().execute(roots, seeds, /*keep_graph=*/false,
                                                            /*create_graph=*/false,
                                                            /*accumulate_grad=*/true);
    if (stage_.embedding) return {};
    torch::Tensor grad = f.input.grad();
    return grad.defined() ? grad : torch::zeros(stage.gradient_shape, f.input.options());
  };
  pipeline_timing_ = PipelineTiming();
  stage.forward = timed(stage.forward, pipeline_timing_.busy_s);
  stage.backward = timed(stage.backward, pipeline_timing_.busy_s);
  // The window is the same on every stage (barriers), so idle time includes the wait for
  // the flush: that is what the bubble fraction (p-1)/(m+p-1) counts.
  pipeline_->barrier();
  const Clock::time_point start = Clock::now();
  parallel::run_one_forward_one_backward(*pipeline_, micro_batches, stage);
  pipeline_->barrier();
  pipeline_timing_.wall_s = seconds_since(start);
  return loss_value;
}

double Trainer::pipeline_evaluate_loss_sum(const std::vector<TokenBatch>& micro) {
  torch::NoGradGuard no_grad;
  double loss_sum = 0;
  if (micro.empty()) return 0;
  const int64_t seq = config_.data.seq_len;
  parallel::PipelineStage stage;
  stage.activation_shape = {micro[0].batch, tp_.sequence_parallel ? seq / tp_.size() : seq,
                            config_.model.hidden};
  stage.dtype = dtype_;
  stage.forward = [&](int m, const torch::Tensor& received) -> torch::Tensor {
    const TokenBatch& b = micro[m];
    TORCH_CHECK(b.batch == micro[0].batch, "validation micro-batches must have one size");
    torch::Tensor x = stage_.embedding ? model_->embed(to_tensor(b.inputs, b.batch)) : received;
    x = model_->run_blocks(x, seq, nullptr);
    if (!stage_.head) return x;
    loss_sum += model_->head_loss_sum(x, to_tensor(b.targets, b.batch)).item<double>();
    return {};
  };
  parallel::run_forwards(*pipeline_, int(micro.size()), stage);
  return loss_sum;
}

}  // namespace retort::engine
