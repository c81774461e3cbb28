// engine/observe/metrics.h: per-step metrics, printed as one console line and appended as one JSON
// object to <run.dir>/metrics.jsonl (step, loss, lr, grad_norm, tokens_per_s, mfu,
// peak_mem_bytes and its split by category, eta_s, valid_loss at evaluation steps (and
// valid_logit_loss, against a teacher cache's validation samples), and the
// process's resident bytes and the part of them in transparent huge pages).
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace retort::engine {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, mfu = 0;
  int64_t peak_mem_bytes = 0;
  double eta_s = 0;
  // Seconds per step this rank spent blocked in communication (parallel/communicator.h's
  // exposed time: waits not hidden behind computation); 0 on one process.
  double exposed_comm_s = 0;
  std::optional<double> valid_loss;
  std::optional<double> valid_logit_loss;  // against a teacher cache's validation samples
  std::map<std::string, double> parts;     // loss components when distilling
  // The device peak since the previous line, by category (common/memory_category.h), and
  // the peak of the offloaded host store.
  std::map<std::string, int64_t> peak_by_category;
  // The process's resident memory when the line was written and the part of it in
  // transparent huge pages (common/resident_memory.h); -1 where the kernel does not say.
  int64_t resident_bytes = -1, huge_page_bytes = -1;
};

std::string format_console_line(const StepMetrics& m);
// The short line a terminal redraws in place after every step.
std::string format_progress_line(const StepMetrics& m);
// Every value of m as (tag, value), the memory split as "peak_mem_by_category/<name>":
// what TensorBoard records.
std::vector<std::pair<std::string, double>> metric_scalars(const StepMetrics& m);
std::string format_bytes(int64_t bytes);
std::string format_duration(double seconds);

class MetricsFile {
 public:
  // Appends to path (a resumed run continues the same file).
  explicit MetricsFile(const std::string& path);
  void write(const StepMetrics& m);
  // A step skipped for a non-finite loss or gradient norm: its values and the run's count.
  void write_skipped(int64_t step, double loss, double grad_norm, int64_t skipped_steps);

 private:
  std::ofstream out_;
};

}  // namespace retort::engine
