// engine/consistency/consistency.cpp: see consistency.h.
#include "engine/consistency/consistency.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>

#include "common/fault_injection.h"
#include "common/make_directories.h"
#include "common/user_error.h"
#include "engine/checkpoint/h5_tensors.h"
#include "engine/consistency/replica_invariants.h"
#include "engine/train/trainer.h"
#include "layers/sharding.h"
#include "parallel/primitives.h"
#include "parallel/stage_collect.h"

namespace retort::engine {

ConsistencyLayout parse_consistency_layout(const std::string& name) {
  static const std::regex part(
      "^(?:PP([0-9]+)(?::([0-9]+(?:-[0-9]+)*))?|(S?)TP([0-9]+)|DP([0-9]+))$");
  ConsistencyLayout layout;
  layout.name = name;
  std::string body = name;
  if (const size_t at = body.rfind('@'); at != std::string::npos) {
    layout.device = body.substr(at + 1);
    if (layout.device != "cpu" && layout.device != "cuda")
      throw UserError("layout '" + name + "': the device after '@' is cpu or cuda");
    body.resize(at);
  }
  if (body.size() > 3 && body.compare(body.size() - 3, 3, "-Z1") == 0) {
    layout.zero_stage = 1;
    body.resize(body.size() - 3);
  }
  auto bad = [&] {
    return UserError("layout '" + name +
                     "': expected parts PPn (or PPn:a-b-.. with the layers per stage), TPn or "
                     "STPn, and DPn joined by "
                     "'x', optionally with -Z1 and then @cpu or @cuda (e.g. PP2xSTP2xDP2-Z1, "
                     "TP1@cpu)");
  };
  std::stringstream parts(body);
  std::string p;
  bool seen[3] = {false, false, false};
  while (std::getline(parts, p, 'x')) {
    std::smatch m;
    if (!std::regex_match(p, m, part)) throw bad();
    const int kind = m[1].matched ? 0 : m[4].matched ? 1 : 2;
    if (seen[kind]) throw bad();
    seen[kind] = true;
    if (kind == 0) {
      layout.pipeline = std::stoi(m[1]);
      std::stringstream split(m[2].str());
      for (std::string n; std::getline(split, n, '-');)
        layout.pipeline_split.push_back(std::stoll(n));
    } else if (kind == 1) {
      layout.sequence_parallel = m[3].length() > 0;
      layout.tensor = std::stoi(m[4]);
    } else {
      layout.data = std::stoi(m[5]);
    }
  }
  if (!seen[0] && !seen[1] && !seen[2]) throw bad();
  return layout;
}

std::string ConsistencyLayout::file_name() const {
  std::string f = name;
  std::replace(f.begin(), f.end(), ':', '_');
  return f;
}

ConsistencyTolerances tolerances_for(const std::string& dtype, int64_t layers, int64_t tokens) {
  if (dtype == "float64") return {1e-10, 1e-9, 1e-9};
  if (dtype != "bfloat16") return {};
  const double u = 1.0 / 256, roundings = 10.0 * double(layers) + 3;
  const double sigma = u * std::sqrt(2 * roundings / 3);
  const double loss = 4 * sigma / std::sqrt(double(std::max<int64_t>(tokens, 1)));
  return {loss, 4 * u * std::sqrt(4 * roundings / 3), 4 * sigma};
}

ConsistencyTolerances tolerances_against_float64(const std::string& dtype, int64_t layers,
                                                 int64_t tokens) {
  ConsistencyTolerances tol = tolerances_for(dtype, layers, tokens);
  tol.gradient = 1;
  tol.gradient_in_rounding_units = true;
  return tol;
}

double bf16_gradient_bound(int64_t elements) {
  const double rounding_ratio = 2;  // a layout's roundings per path against the reference's
  const double z = 5;               // standard deviations of the norm ratio's logarithm
  return std::sqrt(1 + rounding_ratio) *
         std::exp(z / std::sqrt(double(std::max<int64_t>(elements, 1))));
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// "student/layers.0.mixer_output@12": the capture of a micro-batch whose first sample is the
// 12th of the global batch.
std::string placed_name(const std::string& name, int64_t first_sample) {
  return name + "@" + std::to_string(first_sample);
}

// Puts each micro-batch's capture at its place in a [global_batch, ...] tensor per name.
void place_activations(const parallel::NamedTensors& pieces, int64_t global_batch,
                       std::map<std::string, torch::Tensor>* out) {
  for (const auto& [placed, piece] : pieces) {
    const size_t at = placed.rfind('@');
    const std::string name = placed.substr(0, at);
    const int64_t first = std::stoll(placed.substr(at + 1));
    torch::Tensor& whole = (*out)[name];
    if (!whole.defined()) {
      std::vector<int64_t> shape = piece.sizes().vec();
      shape[0] = global_batch;
      whole = torch::full(shape, kNaN, torch::kDouble);
    }
    whole.narrow(0, first, piece.size(0)).copy_(piece);
  }
}

// A double copy on the host that owns its memory: in float64 runs `to` would return the live
// tensor itself, which clipping and the next step then change under the record. On the host,
// records of layouts on different devices compare.
torch::Tensor as_record(const torch::Tensor& t) {
  return t.to(torch::TensorOptions().dtype(torch::kDouble).device(torch::kCPU),
              /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

TrainConfig consistency_train_config(const Config& base, const ConsistencyLayout& layout,
                                     int64_t accumulation) {
  Config config = base;
  const int64_t global_batch = base.get_int("training.global_batch");
  const int64_t micro = global_batch / (layout.data * accumulation);
  if (micro < 1 || micro * layout.data * accumulation != global_batch)
    throw UserError("layout " + layout.name +
                    ": training.global_batch=" + std::to_string(global_batch) +
                    " does not split into " + std::to_string(layout.data) + " DP ranks x " +
                    std::to_string(accumulation) + " accumulation steps");
  config.apply_override("parallel.tensor=" + std::to_string(layout.tensor));
  config.apply_override("parallel.data=" + std::to_string(layout.data));
  config.apply_override("parallel.pipeline=" + std::to_string(layout.pipeline));
  std::string split;
  for (int64_t n : layout.pipeline_split) split += (split.empty() ? "" : ",") + std::to_string(n);
  config.apply_override("parallel.pipeline_split=[" + split + "]");
  config.apply_override(std::string("parallel.sequence_parallel=") +
                        (layout.sequence_parallel ? "true" : "false"));
  config.apply_override("training.micro_batch=" + std::to_string(micro));
  // Each layout's run (its metrics) in a folder of its own under run.dir, replaced at each
  // invocation as the records are: the suite's scratch, not a run to resume.
  config.apply_override("run.dir=" + base.get_string("run.dir") + "/" + layout.file_name());
  config.apply_override("run.overwrite=true");
  config.apply_override("checkpoint.save_at_end=false");
  config.apply_override("optimizer.zero_stage=" + std::to_string(layout.zero_stage));
  config.apply_override("training.eval_every=0");
  if (!layout.device.empty()) config.apply_override("runtime.device=" + layout.device);
  return make_train_config(config, layout.ranks());
}

void run_consistency_layout(const Config& base, const ConsistencyLayout& layout,
                            int64_t accumulation, MPI_Comm world, LayoutRecord* record) {
  int world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm comm;
  const bool member = world_rank < layout.ranks();
  MPI_Comm_split(world, member ? 0 : MPI_UNDEFINED, world_rank, &comm);
  if (!member) return;
  const TrainConfig train_config = consistency_train_config(base, layout, accumulation);

  parallel::Mesh mesh(train_config.layout, comm);
  Trainer trainer(train_config, nullptr, mesh);
  record->transport =
      mesh.world().size() == 1 ? "one rank" : parallel::transport_name(mesh.world().transport());
  if (mesh.gradient_reduction().size() > 1)
    record->dp_sum = trainer.gradient_sync().describe_dp_sum();
  const layers::TensorParallel& tp = trainer.tensor_parallel();
  const bool writer = mesh.world_rank() == 0;
  const bool tp_first = mesh.coordinates().tp == 0;
  const bool gradient_sender = tp_first && mesh.coordinates().dp == 0;

  StepInspector inspector;
  for (int64_t l = 0; l < train_config.model.layers; ++l)
    for (const char* point : layers::kCapturePoints)
      inspector.captures.insert(layers::capture_name(l, point));
  if (distill::Teacher* teacher = trainer.teacher())
    for (int64_t l = 0; l < teacher->config().layers; ++l)
      for (const char* point : layers::kCapturePoints)
        inspector.teacher_captures.insert(layers::capture_name(l, point));
  parallel::NamedTensors activations;  // this rank's captures of the step, placed
  auto keep = [&](const std::string& who, const std::set<std::string>& names,
                  layers::CaptureSink& sink, int64_t first_sample) {
    for (const std::string& name : names) {
      if (!sink.has(name)) continue;  // a layer of another pipeline stage
      torch::Tensor a = sink.at(name).detach().contiguous();
      if (tp.sequence_parallel) a = tp.group->all_gather(a, parallel::kSequenceDim);
      if (tp_first) activations.emplace_back(placed_name(who + name, first_sample), as_record(a));
    }
  };
  inspector.on_captures = [&](int64_t, int64_t first_sample, layers::CaptureSink& student,
                              layers::CaptureSink& teacher) {
    keep("student/", inspector.captures, student, first_sample);
    keep("teacher/", inspector.teacher_captures, teacher, first_sample);
  };
  // The self-test's gradient faults (common/fault_injection.h) act on one parameter, found once,
  // as the gradients are whole: before they are recorded and their norm is taken.
  layers::Parameter* fault_target = nullptr;
  for (layers::Parameter& p : trainer.parameters().all())
    if (p.spec.name == kFaultParameter) fault_target = &p;
  inspector.on_gradients = [&](const StepResult& result) {
    if (fault_target && fault_target->value.grad().defined()) {
      if (fault_injected(Fault::GradScaled)) fault_target->value.mutable_grad().mul_(1 + 1e-3);
      if (fault_injected(Fault::GradMissing)) fault_target->value.mutable_grad().reset();
    }
    parallel::NamedTensors gradients;
    for (auto& p : trainer.parameters().all()) {
      if (p.spec.frozen() || p.spec.tied_copy) continue;  // a tied copy's owner reports it
      torch::Tensor local = p.value.grad();
      if (ZeroPartition* zero =
              trainer.gradient_sync().zero()) {  // the owner holds the summed gradient
        const size_t i = &p - &trainer.parameters().all()[0];
        if (!local.defined()) local = torch::empty_like(p.value);
        zero->group().broadcast(local, zero->owner(i));
      }
      if (!local.defined()) continue;  // never produced: missing from the record
      torch::Tensor global = as_record(to_global(local, p.spec, tp));
      if (gradient_sender) gradients.emplace_back(p.spec.name, global);
    }
    gradients = parallel::collect_on_first_rank(mesh.world(), std::move(gradients));
    parallel::NamedTensors placed =
        parallel::collect_on_first_rank(mesh.world(), std::move(activations));
    activations.clear();
    if (!writer) return;
    StepRecord step_record;
    step_record.loss = result.loss;
    const distill::LossTerms& terms = result.terms;
    step_record.terms["lm"] = terms.lm;
    if (trainer.teacher()) {
      step_record.terms["logit"] = terms.logits;
      step_record.terms["activation"] = terms.activations;
      for (const auto& [name, value] : terms.per_pair)
        step_record.terms["activation." + name] = value;
    }
    for (auto& [name, g] : gradients) step_record.gradients[name] = g;
    place_activations(placed, train_config.training.global_batch, &step_record.activations);
    record->steps.push_back(std::move(step_record));
  };
  inspector.on_step_end = [&](const StepResult& result) {
    const int64_t step = result.step;
    parallel::NamedTensors found;
    for (const std::string& v : replica_invariant_violations(trainer.parameters(), mesh,
                                                             train_config.model.tied_embeddings))
      found.emplace_back("step " + std::to_string(step) + ": " + v, torch::zeros({0}));
    found = parallel::collect_on_first_rank(mesh.world(), std::move(found));
    if (!writer) return;
    record->steps.back().grad_norm = result.grad_norm;
    std::set<std::string> seen(record->replica_violations.begin(),
                               record->replica_violations.end());
    for (const auto& [message, unused] : found)
      if (seen.insert(message).second) record->replica_violations.push_back(message);
  };
  trainer.set_inspector(&inspector);
  trainer.run();
  MPI_Comm_free(&comm);
}

void write_record(const std::string& path, const LayoutRecord& record) {
  make_directories(std::filesystem::path(path).parent_path().string());
  H5Handle file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw UserError("cannot create '" + path + "'");
  std::vector<double> losses, norms;
  for (const StepRecord& s : record.steps) losses.push_back(s.loss), norms.push_back(s.grad_norm);
  h5_write_tensor(file.id, "/losses", torch::tensor(losses, torch::kDouble));
  h5_write_tensor(file.id, "/grad_norms", torch::tensor(norms, torch::kDouble));
  for (size_t i = 0; i < record.steps.size(); ++i) {
    const StepRecord& s = record.steps[i];
    const std::string step = "/step_" + std::to_string(i + 1);
    for (const auto& [name, value] : s.terms)
      h5_write_tensor(file.id, step + "/terms/" + name, torch::tensor({value}, torch::kDouble));
    for (const auto& [name, g] : s.gradients)
      h5_write_tensor(file.id, step + "/gradients/" + name, g);
    for (const auto& [name, a] : s.activations)
      h5_write_tensor(file.id, step + "/activations/" + name, a);
  }
}

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Relative difference; anything not finite (NaN in either side) is infinitely different.
double relative(const torch::Tensor& value, const torch::Tensor& reference) {
  if (value.sizes() != reference.sizes()) return kInfinity;
  const double ref = reference.norm().item<double>();
  const double diff = (value - reference).norm().item<double>();
  const double r = ref > 0 ? diff / ref : diff;
  return std::isfinite(r) ? r : kInfinity;
}

double relative(double value, double reference) {
  if (value == reference) return 0;
  const double r = std::abs(value - reference) / std::abs(reference);
  return std::isfinite(r) ? r : kInfinity;
}

// ||value - reference|| / ||reference - exact||: the difference from the reference in units of
// the reference's own rounding error, `exact` being the reference layout run in float64.
double in_rounding_units(const torch::Tensor& value, const torch::Tensor& reference,
                         const torch::Tensor& exact) {
  if (value.sizes() != reference.sizes() || exact.sizes() != reference.sizes()) return kInfinity;
  const double diff = (value - reference).norm().item<double>();
  if (diff == 0) return 0;
  const double r = diff / (reference - exact).norm().item<double>();
  return std::isfinite(r) ? r : kInfinity;
}

std::string at_step(const std::string& name, size_t step) {
  return name + " @ step " + std::to_string(step + 1);
}

std::string scientific(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3e", value);
  return text;
}

// One kind of quantity compared over one step: records the worst and every failure.
struct Tally {
  const char* kind;  // "gradient", "activation", "term"
  double tolerance;
  double* worst;
  std::string* where;
  std::vector<std::string>* failures;

  const char* measure = "relative difference";

  void add(const std::string& name, size_t step, double r) {
    if (r > *worst || where->empty()) *worst = std::max(*worst, r), *where = at_step(name, step);
    if (!(r <= tolerance))
      failures->push_back(std::string(kind) + " " + at_step(name, step) + ": " + measure + " " +
                          scientific(r) + " > " + scientific(tolerance));
  }
  void missing(const std::string& name, size_t step, const char* side) {
    *worst = kInfinity;
    *where = at_step(name, step);
    failures->push_back(std::string(kind) + " " + at_step(name, step) + ": " + side);
  }
  template <typename Value, typename Measure>
  void compare(const std::map<std::string, Value>& reference,
               const std::map<std::string, Value>& other, size_t step, Measure measure) {
    for (const auto& [name, value] : other)
      if (!reference.count(name)) missing(name, step, "recorded here but not in the reference");
    for (const auto& [name, ref] : reference) {
      auto it = other.find(name);
      if (it == other.end())
        missing(name, step, "in the reference but missing here");
      else
        add(name, step, measure(name, it->second, ref));
    }
  }
};

bool finite(const torch::Tensor& t) {
  return torch::isfinite(t).all().item<bool>();
}

}  // namespace

ComparisonRow check_reference(const std::string& name, const LayoutRecord& reference) {
  ComparisonRow row;
  row.layout = name + " (ref)";
  if (reference.steps.empty()) row.failures.push_back("no step recorded");
  for (size_t i = 0; i < reference.steps.size(); ++i) {
    const StepRecord& s = reference.steps[i];
    if (!std::isfinite(s.loss)) row.failures.push_back(at_step("loss", i) + " is not finite");
    if (!std::isfinite(s.grad_norm))
      row.failures.push_back(at_step("gradient norm", i) + " is not finite");
    for (const auto& [term, value] : s.terms)
      if (!std::isfinite(value))
        row.failures.push_back(at_step("term " + term, i) + " is not finite");
    if (s.gradients.empty()) row.failures.push_back(at_step("gradients", i) + ": none recorded");
    for (const auto& [param, g] : s.gradients) {
      if (!finite(g)) row.failures.push_back(at_step("gradient " + param, i) + " is not finite");
      // Only trainable parameters are recorded: an exactly zero gradient means a part of the
      // model the loss never reached, which would make every comparison of it vacuous.
      else if (g.abs().max().item<double>() == 0)
        row.failures.push_back(at_step("gradient " + param, i) +
                               " is exactly zero for a trainable parameter");
    }
    for (const auto& [capture, a] : s.activations)
      if (!finite(a))
        row.failures.push_back(at_step("activation " + capture, i) +
                               " is not finite (or a micro-batch never arrived)");
  }
  row.replica_violations = int64_t(reference.replica_violations.size());
  for (const std::string& v : reference.replica_violations) row.failures.push_back(v);
  return row;
}

ComparisonRow compare_records(const std::string& name, const LayoutRecord& reference,
                              const LayoutRecord& other, const ConsistencyTolerances& tol,
                              double norm_tolerance, const LayoutRecord* float64_reference) {
  ComparisonRow row;
  row.layout = name;
  if (other.steps.size() != reference.steps.size()) {
    row.failures.push_back("ran " + std::to_string(other.steps.size()) + " steps, the reference " +
                           std::to_string(reference.steps.size()));
    row.loss = kInfinity;
    return row;
  }
  std::string loss_where, norm_where;
  Tally losses{"loss", tol.loss, &row.loss, &loss_where, &row.failures};
  Tally norms{"gradient norm", norm_tolerance >= 0 ? norm_tolerance : tol.loss, &row.grad_norm,
              &norm_where, &row.failures};
  Tally terms{"term", tol.loss, &row.terms, &row.worst_term, &row.failures};
  Tally gradients{"gradient", tol.gradient, &row.gradient, &row.worst_gradient, &row.failures};
  if (tol.gradient_in_rounding_units)
    gradients.measure = "difference in the reference's rounding errors, share of its bound";
  Tally activations{"activation", tol.activation, &row.activation, &row.worst_activation,
                    &row.failures};
  auto scalar = [](const std::string&, double a, double b) { return relative(a, b); };
  auto tensor = [](const std::string&, const torch::Tensor& a, const torch::Tensor& b) {
    return relative(a, b);
  };
  if (tol.gradient_in_rounding_units &&
      (!float64_reference || float64_reference->steps.size() != reference.steps.size()))
    throw std::logic_error(
        "compare_records: gradients in rounding units need the reference's "
        "float64 record, step for step");
  for (size_t i = 0; i < reference.steps.size(); ++i) {
    const StepRecord &ref = reference.steps[i], &s = other.steps[i];
    losses.add("loss", i, relative(s.loss, ref.loss));
    norms.add("|g|", i, relative(s.grad_norm, ref.grad_norm));
    terms.compare(ref.terms, s.terms, i, scalar);
    if (tol.gradient_in_rounding_units) {
      // The difference from the reference in units of the reference's own rounding error, as
      // a share of the tensor's bound.
      const auto& exact = float64_reference->steps[i].gradients;
      gradients.compare(
          ref.gradients, s.gradients, i,
          [&](const std::string& param, const torch::Tensor& g, const torch::Tensor& g_ref) {
            auto it = exact.find(param);
            if (it == exact.end()) return kInfinity;
            return in_rounding_units(g, g_ref, it->second) / bf16_gradient_bound(g.numel());
          });
    } else {
      gradients.compare(ref.gradients, s.gradients, i, tensor);
    }
    activations.compare(ref.activations, s.activations, i, tensor);
  }
  row.replica_violations = int64_t(other.replica_violations.size());
  for (const std::string& v : other.replica_violations) row.failures.push_back(v);
  return row;
}

std::string format_comparison_table(const std::vector<ComparisonRow>& rows,
                                    const ConsistencyTolerances& tol, size_t max_failures) {
  std::ostringstream os;
  char line[768];
  const char* format =
      "| %-16s | %-9s | %-9s | %-9s | %-30s | %-9s | %-42s | %-9s | %-42s | %-8s | %-3s |\n";
  std::snprintf(line, sizeof(line), format, "layout", "loss", "|g|", "terms", "worst term",
                "gradients", "worst gradient", "activ.", "worst activation", "replicas", "ok");
  os << line;
  std::snprintf(line, sizeof(line), format, "---", "---", "---", "---", "---", "---", "---", "---",
                "---", "---", "---");
  os << line;
  for (const ComparisonRow& r : rows) {
    std::snprintf(
        line, sizeof(line),
        "| %-16s | %9.2e | %9.2e | %9.2e | %-30s | %9.2e | %-42s | %9.2e | %-42s | %8lld | "
        "%-3s |\n",
        r.layout.c_str(), r.loss, r.grad_norm, r.terms, r.worst_term.c_str(), r.gradient,
        r.worst_gradient.c_str(), r.activation, r.worst_activation.c_str(),
        (long long)r.replica_violations, r.ok() ? "yes" : "NO");
    os << line;
  }
  std::snprintf(line, sizeof(line),
                "worst relative differences against the reference over every step; tolerances: "
                "loss, terms and |g| %.2g, gradients %.2g, activations %.2g\n",
                tol.loss, tol.gradient, tol.activation);
  os << line;
  if (tol.gradient_in_rounding_units)
    os << "gradients: ||g - g_ref|| / ||g_ref - g_ref(float64)|| as a share of the tensor's bound "
          "sqrt(3) exp(5 / sqrt(elements)) (docs/numerics.md, \"Tolerances in bf16, derived\")\n";
  for (const ComparisonRow& r : rows) {
    for (size_t i = 0; i < r.failures.size() && i < max_failures; ++i)
      os << "FAIL " << r.layout << ": " << r.failures[i] << "\n";
    if (r.failures.size() > max_failures)
      os << "FAIL " << r.layout << ": ... and " << r.failures.size() - max_failures << " more\n";
  }
  return os.str();
}

}  // namespace retort::engine
