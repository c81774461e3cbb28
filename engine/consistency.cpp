// engine/consistency.cpp: see consistency.h.
#include "engine/consistency.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>

#include "common/user_error.h"
#include "engine/h5_tensors.h"
#include "engine/sharding.h"
#include "engine/trainer.h"
#include "parallel/primitives.h"
#include "parallel/stage_collect.h"

namespace retort::engine {

ConsistencyLayout parse_consistency_layout(const std::string& name) {
  static const std::regex part(
      "^(?:PP([0-9]+)(?::([0-9]+(?:-[0-9]+)*))?|(S?)TP([0-9]+)|DP([0-9]+))$");
  ConsistencyLayout l;
  l.name = name;
  std::string body = name;
  if (body.size() > 3 && body.compare(body.size() - 3, 3, "-Z1") == 0) {
    l.zero_stage = 1;
    body.resize(body.size() - 3);
  }
  auto bad = [&] {
    return UserError("layout '" + name +
                     "': expected parts PPn (or PPn:a-b-.. with the layers per stage), TPn or "
                     "STPn, and DPn joined by "
                     "'x', optionally with -Z1 (e.g. PP2xSTP2xDP2-Z1)");
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
      l.pipeline = std::stoi(m[1]);
      std::stringstream split(m[2].str());
      for (std::string n; std::getline(split, n, '-');) l.pipeline_split.push_back(std::stoll(n));
    } else if (kind == 1) {
      l.sequence_parallel = m[3].length() > 0;
      l.tensor = std::stoi(m[4]);
    } else {
      l.data = std::stoi(m[5]);
    }
  }
  if (!seen[0] && !seen[1] && !seen[2]) throw bad();
  return l;
}

std::string ConsistencyLayout::file_name() const {
  std::string f = name;
  std::replace(f.begin(), f.end(), ':', '_');
  return f;
}

void run_consistency_layout(const Config& base, const ConsistencyLayout& layout,
                            int64_t accumulation, int64_t compare_samples, MPI_Comm world,
                            LayoutRecord* record) {
  int world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm comm;
  const bool member = world_rank < layout.ranks();
  MPI_Comm_split(world, member ? 0 : MPI_UNDEFINED, world_rank, &comm);
  if (!member) return;

  Config config = base;
  const int64_t global_batch = base.get_int("training.global_batch");
  const int64_t micro = global_batch / (layout.data * accumulation);
  if (micro < compare_samples || micro * layout.data * accumulation != global_batch)
    throw UserError("layout " + layout.name +
                    ": training.global_batch=" + std::to_string(global_batch) +
                    " does not give micro-batches of at least " + std::to_string(compare_samples) +
                    " samples with " + std::to_string(accumulation) + " accumulation steps");
  config.apply_override("parallel.tensor=" + std::to_string(layout.tensor));
  config.apply_override("parallel.data=" + std::to_string(layout.data));
  config.apply_override("parallel.pipeline=" + std::to_string(layout.pipeline));
  std::string split;
  for (int64_t n : layout.pipeline_split) split += (split.empty() ? "" : ",") + std::to_string(n);
  config.apply_override("parallel.pipeline_split=[" + split + "]");
  config.apply_override(std::string("parallel.sequence_parallel=") +
                        (layout.sequence_parallel ? "true" : "false"));
  config.apply_override("training.micro_batch=" + std::to_string(micro));
  config.apply_override("checkpoint.save_at_end=false");
  config.apply_override("optimizer.zero_stage=" + std::to_string(layout.zero_stage));
  config.apply_override("training.eval_every=0");
  TrainConfig train_config = make_train_config(config, layout.ranks());

  parallel::Mesh mesh(train_config.layout, comm);
  Trainer trainer(train_config, nullptr, &mesh);
  const layers::TensorParallel& tp = trainer.tensor_parallel();
  const bool writer = mesh.world_rank() == 0;
  const bool dp_first = mesh.coordinates().dp == 0;
  // Stages send what they recorded to the writer over the writer's pipeline group.
  parallel::Communicator* collect_over =
      trainer.pipeline() && dp_first && mesh.coordinates().tp == 0 ? trainer.pipeline() : nullptr;

  StepInspector inspector;
  for (int64_t l = 0; l < train_config.model.layers; ++l)
    for (const char* point : layers::kCapturePoints)
      inspector.captures.insert(layers::capture_name(l, point));
  parallel::NamedTensors stage_activations;  // this stage's layers, kept until the step ends
  inspector.on_captures = [&](int64_t step, layers::CaptureSink& sink) {
    // Activations of the first samples of DP rank 0 (the same samples in every layout).
    if (!dp_first) return;
    for (const std::string& name : inspector.captures) {
      if (!sink.has(name)) continue;  // a layer of another pipeline stage
      torch::Tensor a = sink.at(name).detach().narrow(0, 0, compare_samples).contiguous();
      if (tp.sequence_parallel) a = tp.group->all_gather(a, parallel::kSequenceDim);
      stage_activations.emplace_back(name, a.to(torch::kDouble));
    }
  };
  inspector.on_gradients = [&](int64_t step, double loss) {
    if (writer) record->losses.push_back(loss);
    parallel::NamedTensors gradients;
    for (auto& p : trainer.parameters().all()) {
      if (p.spec.frozen() || p.spec.tied_copy) continue;  // a tied copy's owner reports it
      torch::Tensor local = p.value.grad();
      if (ZeroPartition* zero = trainer.zero()) {  // the owner holds the summed gradient
        const size_t i = &p - &trainer.parameters().all()[0];
        if (!local.defined()) local = torch::empty_like(p.value);
        zero->group().broadcast(local, zero->owner(i));
      }
      gradients.emplace_back(p.spec.name, to_global(local, p.spec, tp).to(torch::kDouble));
    }
    if (collect_over) {
      gradients = parallel::collect_on_first_stage(*collect_over, std::move(gradients));
      stage_activations = parallel::collect_on_first_stage(*collect_over, stage_activations);
    }
    if (writer) {
      for (auto& [name, g] : gradients) record->gradients[step][name] = g;
      for (auto& [name, a] : stage_activations) record->activations[step][name] = a;
    }
    stage_activations.clear();
  };
  inspector.on_step_end = [&](int64_t, double norm) {
    if (writer) record->grad_norms.push_back(norm);
  };
  trainer.set_inspector(&inspector);
  trainer.run();
  MPI_Comm_free(&comm);
}

void write_record(const std::string& path, const LayoutRecord& record) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  H5Handle file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw UserError("cannot create '" + path + "'");
  h5_write_tensor(file.id, "/losses", torch::tensor(record.losses, torch::kDouble));
  h5_write_tensor(file.id, "/grad_norms", torch::tensor(record.grad_norms, torch::kDouble));
  for (const auto& [step, grads] : record.gradients)
    for (const auto& [name, g] : grads)
      h5_write_tensor(file.id, "/step_" + std::to_string(step) + "/gradients/" + name, g);
  for (const auto& [step, acts] : record.activations)
    for (const auto& [name, a] : acts)
      h5_write_tensor(file.id, "/step_" + std::to_string(step) + "/activations/" + name, a);
}

namespace {

// Relative difference; anything not finite (NaN in either side) is infinitely different.
double relative(const torch::Tensor& value, const torch::Tensor& reference) {
  const double ref = reference.norm().item<double>();
  const double diff = (value - reference).norm().item<double>();
  const double r = ref > 0 ? diff / ref : diff;
  return std::isfinite(r) ? r : std::numeric_limits<double>::infinity();
}

double relative(double value, double reference) {
  const double r = std::abs(value - reference) / std::abs(reference);
  return std::isfinite(r) ? r : std::numeric_limits<double>::infinity();
}

// Worst relative difference over the tensors of `reference`; a tensor missing from `other`
// or of another shape, or one `other` has in excess, counts as infinitely different.
double worst(const std::map<std::string, torch::Tensor>& reference,
             const std::map<std::string, torch::Tensor>& other, std::string* where) {
  for (const auto& [name, tensor] : other)
    if (!reference.count(name)) {
      *where = name + " (not in the reference)";
      return std::numeric_limits<double>::infinity();
    }
  double worst_value = 0;
  for (const auto& [name, ref] : reference) {
    auto it = other.find(name);
    double r = std::numeric_limits<double>::infinity();
    if (it != other.end() && it->second.sizes() == ref.sizes()) r = relative(it->second, ref);
    if (r > worst_value || where->empty()) worst_value = std::max(worst_value, r), *where = name;
  }
  return worst_value;
}

}  // namespace

ComparisonRow compare_records(const std::string& name, const LayoutRecord& reference,
                              const LayoutRecord& other, const ConsistencyTolerances& tol) {
  ComparisonRow row;
  row.layout = name;
  if (other.losses.size() != reference.losses.size()) {
    row.ok = false;
    row.loss = std::numeric_limits<double>::infinity();
    return row;
  }
  for (size_t i = 0; i < reference.losses.size(); ++i)
    row.loss = std::max(row.loss, relative(other.losses[i], reference.losses[i]));
  for (size_t i = 0; i < reference.grad_norms.size(); ++i)
    row.grad_norm =
        std::max(row.grad_norm, i < other.grad_norms.size()
                                    ? relative(other.grad_norms[i], reference.grad_norms[i])
                                    : std::numeric_limits<double>::infinity());
  const int64_t first = 1;
  row.gradient =
      worst(reference.gradients.at(first), other.gradients.at(first), &row.worst_gradient);
  row.activation =
      worst(reference.activations.at(first), other.activations.at(first), &row.worst_activation);
  row.ok = row.loss <= tol.loss && row.grad_norm <= tol.loss && row.gradient <= tol.gradient &&
           row.activation <= tol.activation;
  return row;
}

std::string format_comparison_table(const std::vector<ComparisonRow>& rows,
                                    const ConsistencyTolerances& tol) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof(line),
                "| %-12s | %-12s | %-12s | %-12s | %-40s | %-12s | %-34s | %-4s |\n", "layout",
                "loss (all)", "|g| (all)", "grad step 1", "worst gradient", "act step 1",
                "worst activation", "ok");
  os << line;
  os << "|--------------|--------------|--------------|--------------|-----------------------------"
        "-------------|"
        "--------------|------------------------------------|------|\n";
  for (const ComparisonRow& r : rows) {
    std::snprintf(line, sizeof(line),
                  "| %-12s | %12.3e | %12.3e | %12.3e | %-40s | %12.3e | %-34s | %-4s |\n",
                  r.layout.c_str(), r.loss, r.grad_norm, r.gradient, r.worst_gradient.c_str(),
                  r.activation, r.worst_activation.c_str(), r.ok ? "yes" : "NO");
    os << line;
  }
  std::snprintf(line, sizeof(line),
                "relative differences against the reference; tolerances: loss %.0e, gradient "
                "%.0e, activation %.0e\n",
                tol.loss, tol.gradient, tol.activation);
  os << line;
  return os.str();
}

}  // namespace retort::engine
