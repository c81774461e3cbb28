// engine/train/stage_step.cpp: see stage_step.h.
#include "engine/train/stage_step.h"

#include <torch/csrc/autograd/engine.h>

#include <chrono>

#include "common/memory_category.h"
#include "common/trace_span.h"
#include "parallel/pipeline_runner.h"

namespace retort::engine {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Wraps a stage callback so its running time is added to `total`.
template <typename Callback>
auto timed(Callback callback, double& total, const char* phase) {
  return [callback, &total, phase](int m, const torch::Tensor& t) {
    TraceSpan span(
        [&] { return std::string("retort ") + phase + " micro-batch " + std::to_string(m); });
    const Clock::time_point start = Clock::now();
    torch::Tensor out = callback(m, t);
    total += seconds_since(start);
    return out;
  };
}

torch::autograd::Edge edge_of(const torch::Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  return torch::autograd::impl::gradient_edge(t);
}

}  // namespace

// What a stage keeps of a micro-batch between its forward and its backward.
struct StageStep::InFlight {
  torch::Tensor input;                // the received hidden state (a leaf); undefined on stage 0
  torch::autograd::Edge output_edge;  // where the output's gradient enters the graph
  torch::autograd::Edge loss_edge;    // the same for this stage's loss part
  torch::Tensor loss_seed;            // d(loss)/d(loss part) = 1, in the loss's dtype
};

StageStep::StageStep(StageModels models, const layers::TensorParallel& tp, int64_t seq_len,
                     torch::ScalarType dtype)
    : models_(models), tp_(tp), seq_len_(seq_len), dtype_(dtype) {}

std::vector<int64_t> StageStep::hidden_shape(int64_t batch, int64_t width) const {
  return {batch, tp_.sequence_parallel ? seq_len_ / tp_.size() : seq_len_, width};
}

std::set<std::string> StageStep::student_captures(const StepInspector* inspector) const {
  std::set<std::string> wanted = inspector ? inspector->captures : std::set<std::string>{};
  if (models_.distiller) {
    auto s = models_.distiller->student_captures();
    wanted.insert(s.begin(), s.end());
  }
  return wanted;
}

std::set<std::string> StageStep::teacher_captures(const StepInspector* inspector) const {
  if (!models_.distiller) return {};
  std::set<std::string> wanted = inspector ? inspector->teacher_captures : std::set<std::string>{};
  auto t = models_.distiller->teacher_captures();
  wanted.insert(t.begin(), t.end());
  return wanted;
}

void StageStep::train(parallel::Communicator& pp, const std::vector<MicroBatch>& micro,
                      double target_count, int64_t step, GradientSync& sync,
                      StepInspector* inspector, distill::PendingTerms& pending, StepTimes& times) {
  const layers::LlamaModel& student = *models_.student;
  distill::Distiller* distiller = models_.distiller;
  distill::Teacher* teacher = models_.teacher;
  const layers::ModelStage& stage = student.stage();
  const int64_t student_width = student.config().hidden;
  const bool teacher_travels = distiller && distiller->needs_teacher();
  const int64_t teacher_width = teacher_travels ? teacher->config().hidden : 0;
  const bool inspect_captures = inspector && inspector->inspects_captures();
  const int micro_batches = int(micro.size());
  const int64_t batch = micro.at(0).tokens.size(0);
  std::vector<InFlight> in_flight(micro.size());
  // The loss and its terms stay where the losses are formed until the step's end: one read to
  // the host per step (the caller's), not one per micro-batch.

  // Tied on this stage: the head's gradient waits for the lookup's sparse rows, which add into
  // it in place (layers::TiedHeadGradientSink), unless a sink of the trainer's takes it (the
  // last micro-batch's).
  layers::HeadGradSink* tied_head =
      student.tied_head_sink() && student.head_weight().requires_grad() ? student.tied_head_sink()
                                                                        : nullptr;

  parallel::PipelineStage runner;
  runner.activation_shape = hidden_shape(batch, student_width + teacher_width);
  runner.gradient_shape = hidden_shape(batch, student_width);
  runner.dtype = dtype_;
  runner.device = micro.at(0).tokens.device();  // the batches are placed where the model is
  runner.forward = [&](int m, const torch::Tensor& received) -> torch::Tensor {
    const MicroBatch& micro_batch = micro[m];
    InFlight& flight = in_flight[m];
    torch::Tensor x, t;
    // What the forward allocates and keeps is the student's saved activations or the
    // teacher's activations (its hidden state, captures and logits); backward's temporaries
    // count as the rest.
    MemoryScope student_memory(MemoryCategory::activations);
    if (stage.embedding) {
      x = student.embed(micro_batch.tokens);
      MemoryScope teacher_memory(MemoryCategory::teacher_activations);
      if (teacher_travels) t = teacher->embed(micro_batch.tokens);
    } else {
      flight.input =
          (teacher_travels ? received.narrow(2, 0, student_width).contiguous() : received)
              .requires_grad_(true);
      x = flight.input;
      MemoryScope teacher_memory(MemoryCategory::teacher_activations);
      if (teacher_travels) t = received.narrow(2, student_width, teacher_width).contiguous();
    }
    layers::CaptureSink sink(student_captures(inspector)),
        teacher_sink(teacher_captures(inspector));
    x = student.run_blocks(x, seq_len_, sink.wants_any() ? &sink : nullptr);
    if (teacher_travels) {
      TraceSpan span([] { return "retort teacher blocks"; });
      MemoryScope teacher_memory(MemoryCategory::teacher_activations);
      t = teacher->run_blocks(t, seq_len_, &teacher_sink);
    }
    // Before the activation losses take (and free) the teacher's captures.
    if (inspect_captures)
      inspector->on_captures(step, micro_batch.first_sample, sink, teacher_sink);

    torch::Tensor loss;  // this stage's part of the micro-batch's loss
    if (distiller)
      loss = distiller->activation_loss(micro_batch.targets, sink, teacher_sink, target_count,
                                        &pending);
    if (stage.head) {
      TraceSpan span([] { return "retort head and loss"; });
      torch::Tensor head;
      // The last micro-batch's backward makes the head weight's gradient final.
      layers::HeadGradSink* head_sink = m + 1 == micro_batches && head_grad_sink_ ? head_grad_sink_
                                        : tied_head                               ? tied_head
                                                                                  : nullptr;
      if (!distiller) {
        head = student.head_loss_sum(x, micro_batch.targets, head_sink) / target_count;
      } else {
        // The heads are fused into the losses: no [tokens, vocab] logits outlive a chunk.
        // Full checkpointing keeps only the head inputs and forms the logits again in
        // backward; otherwise the gradient is formed in forward.
        const distill::HeadInput student_head{student.head_input(x), student.head_weight(),
                                              head_sink};
        if (distiller->logits_from_cache()) {
          distill::SparseTeacher cached;
          {
            MemoryScope teacher_memory(MemoryCategory::teacher_activations);
            cached = models_.cache->entries(micro_batch.stream_sample, batch, x.device());
          }
          head = distiller->output_loss_from_cache(student_head, cached, micro_batch.targets,
                                                   target_count, student.config().vocab_size,
                                                   student.head_chunk_tokens(), &pending);
        } else {
          distill::HeadInput teacher_head;
          if (distiller->needs_teacher_logits()) {
            MemoryScope teacher_memory(MemoryCategory::teacher_activations);
            teacher_head = teacher->head_input(t);
          }
          const bool recompute = student.recompute().mode == layers::Checkpointing::full;
          head = distiller->output_loss(student_head, teacher_head, micro_batch.targets,
                                        target_count, student.config().vocab_size,
                                        student.head_chunk_tokens(), recompute, &pending);
        }
      }
      loss = loss.defined() ? loss + head : head;
    }
    if (loss.defined()) {
      pending.add_value("loss", loss);
      flight.loss_edge = edge_of(loss);
      flight.loss_seed = torch::ones({}, loss.options());
    }
    if (stage.head) return {};
    flight.output_edge = edge_of(x);
    return teacher_travels ? torch::cat({x.detach(), t}, 2) : x.detach();
  };
  runner.backward = [&](int m, const torch::Tensor& output_grad) -> torch::Tensor {
    // The last micro-batch's backward finishes gradients as they become final.
    if (m + 1 == micro_batches) sync.arm();
    InFlight flight = std::move(in_flight[m]);
    torch::autograd::edge_list roots;
    std::vector<torch::Tensor> seeds;
    if (flight.output_edge.is_valid()) {
      roots.push_back(flight.output_edge);
      seeds.push_back(output_grad);
    }
    if (flight.loss_edge.is_valid()) {
      roots.push_back(flight.loss_edge);
      seeds.push_back(flight.loss_seed);
    }
    if (!roots.empty())
      torch::autograd::Engine::get_default_engine().execute(roots, seeds, /*keep_graph=*/false,
                                                            /*create_graph=*/false,
                                                            /*accumulate_grad=*/true);
    if (stage.embedding) return {};
    torch::Tensor grad = flight.input.grad();
    return grad.defined() ? grad : torch::zeros(runner.gradient_shape, flight.input.options());
  };
  runner.forward = timed(runner.forward, times.forward_s, "forward");
  runner.backward = timed(runner.backward, times.backward_s, "backward");

  // Bubble timing, when asked for: the window is the same on every stage (barriers), so idle
  // time includes the wait for the flush, which the bubble fraction (p-1)/(m+p-1) counts.
  const bool time_pipeline = inspector && inspector->time_pipeline;
  if (time_pipeline) pp.barrier();
  const Clock::time_point start = Clock::now();
  parallel::run_one_forward_one_backward(pp, micro_batches, runner);
  if (time_pipeline) pp.barrier();
  times.schedule_s += seconds_since(start);
  if (time_pipeline)
    inspector->pipeline_timing = {times.forward_s + times.backward_s, times.schedule_s};
}

double StageStep::evaluate(parallel::Communicator& pp, const std::vector<MicroBatch>& micro,
                           double* logit_sum) {
  torch::NoGradGuard no_grad;
  if (micro.empty()) return 0;
  const layers::LlamaModel& student = *models_.student;
  torch::Tensor loss_sum, logit_total;
  parallel::PipelineStage runner;
  runner.activation_shape = hidden_shape(micro[0].tokens.size(0), student.config().hidden);
  runner.dtype = dtype_;
  runner.device = micro[0].tokens.device();
  runner.forward = [&](int m, const torch::Tensor& received) -> torch::Tensor {
    const MicroBatch& micro_batch = micro[m];
    TORCH_CHECK(micro_batch.tokens.size(0) == micro[0].tokens.size(0),
                "validation micro-batches must have one size");
    torch::Tensor x = student.stage().embedding ? student.embed(micro_batch.tokens) : received;
    x = student.run_blocks(x, seq_len_, nullptr);
    if (!student.stage().head) return x;
    const torch::Tensor sum = student.head_loss_sum(x, micro_batch.targets).to(torch::kDouble);
    loss_sum = loss_sum.defined() ? loss_sum + sum : sum;  // read once, after the last
    if (logit_sum && models_.valid_cache && models_.distiller) {
      const distill::SparseTeacher cached = models_.valid_cache->entries(
          micro_batch.stream_sample, micro_batch.tokens.size(0), x.device());
      const torch::Tensor logits =
          models_.distiller
              ->cached_logit_sum({student.head_input(x), student.head_weight()}, cached,
                                 micro_batch.targets, student.config().vocab_size)
              .to(torch::kDouble);
      logit_total = logit_total.defined() ? logit_total + logits : logits;
    }
    return {};
  };
  parallel::run_forwards(pp, int(micro.size()), runner);
  if (logit_sum) *logit_sum = logit_total.defined() ? logit_total.item<double>() : 0.0;
  return loss_sum.defined() ? loss_sum.item<double>() : 0.0;
}

}  // namespace retort::engine
