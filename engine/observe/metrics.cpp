// engine/observe/metrics.cpp: see metrics.h.
#include "engine/observe/metrics.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/make_directories.h"
#include "common/user_error.h"

namespace retort::engine {

std::string format_bytes(int64_t bytes) {
  char text[32];
  const double b = double(bytes);
  if (b >= 1e9)
    std::snprintf(text, sizeof(text), "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(text, sizeof(text), "%.1f MB", b / 1e6);
  else if (b >= 1e3)
    std::snprintf(text, sizeof(text), "%.1f kB", b / 1e3);
  else  // a scalar's few bytes would read "0.0 kB"
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  return text;
}

std::string format_duration(double seconds) {
  char text[32];
  const long s = long(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(text, sizeof(text), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(text, sizeof(text), "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(text, sizeof(text), "%lds", s);
  return text;
}

std::string format_console_line(const StepMetrics& m) {
  char text[256];
  std::snprintf(text, sizeof(text),
                "step %lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | MFU %.1f%% | "
                "peak %s | ETA %s",
                (long long)m.step, (long long)m.total_steps, m.loss, m.lr, m.grad_norm,
                m.tokens_per_s, 100.0 * m.mfu, format_bytes(m.peak_mem_bytes).c_str(),
                format_duration(m.eta_s).c_str());
  std::string line = text;
  if (m.exposed_comm_s > 0) {
    std::snprintf(text, sizeof(text), " | comm %.3fs", m.exposed_comm_s);
    line += text;
  }
  if (m.valid_loss) {
    std::snprintf(text, sizeof(text), " | valid %.4f", *m.valid_loss);
    line += text;
  }
  for (const char* part : {"lm_loss", "logit_loss", "activation_loss"}) {
    auto it = m.parts.find(part);
    if (it == m.parts.end()) continue;
    std::snprintf(text, sizeof(text), " | %s %.4f", part, it->second);
    line += text;
  }
  return line;
}

std::string format_progress_line(const StepMetrics& m) {
  char text[200];
  std::snprintf(text, sizeof(text), "step %lld/%lld | loss %.4f | %.0f tok/s | MFU %.1f%% | ETA %s",
                (long long)m.step, (long long)m.total_steps, m.loss, m.tokens_per_s, 100.0 * m.mfu,
                format_duration(m.eta_s).c_str());
  return text;
}

std::vector<std::pair<std::string, double>> metric_scalars(const StepMetrics& m) {
  std::vector<std::pair<std::string, double>> scalars = {
      {"loss", m.loss},
      {"lr", m.lr},
      {"grad_norm", m.grad_norm},
      {"tokens_per_s", m.tokens_per_s},
      {"mfu", m.mfu},
      {"peak_mem_bytes", double(m.peak_mem_bytes)},
      {"eta_s", m.eta_s},
      {"exposed_comm_s", m.exposed_comm_s}};
  if (m.valid_loss) scalars.emplace_back("valid_loss", *m.valid_loss);
  if (m.valid_logit_loss) scalars.emplace_back("valid_logit_loss", *m.valid_logit_loss);
  for (const auto& [name, value] : m.parts) scalars.emplace_back(name, value);
  for (const auto& [name, bytes] : m.peak_by_category)
    scalars.emplace_back("peak_mem_by_category/" + name, double(bytes));
  if (m.resident_bytes >= 0) scalars.emplace_back("resident_bytes", double(m.resident_bytes));
  if (m.huge_page_bytes >= 0) scalars.emplace_back("huge_page_bytes", double(m.huge_page_bytes));
  return scalars;
}

MetricsFile::MetricsFile(const std::string& path) : out_(path, std::ios::app) {
  if (!out_)
    throw UserError("cannot open metrics file '" + path + "'" +
                    why_writes_fail(std::filesystem::path(path).parent_path().string()));
}

void MetricsFile::write(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu},
                      {"peak_mem_bytes", m.peak_mem_bytes},
                      {"eta_s", m.eta_s},
                      {"exposed_comm_s", m.exposed_comm_s}};
  if (m.valid_loss) j["valid_loss"] = *m.valid_loss;
  if (m.valid_logit_loss) j["valid_logit_loss"] = *m.valid_logit_loss;
  for (const auto& [name, value] : m.parts) j[name] = value;
  if (!m.peak_by_category.empty()) j["peak_mem_by_category"] = m.peak_by_category;
  if (m.resident_bytes >= 0) j["resident_bytes"] = m.resident_bytes;
  if (m.huge_page_bytes >= 0) j["huge_page_bytes"] = m.huge_page_bytes;
  out_ << j.dump() << "\n";
  out_.flush();
}

void MetricsFile::write_skipped(int64_t step, double loss, double grad_norm,
                                int64_t skipped_steps) {
  // JSON has no NaN or infinity: non-finite values are written as strings.
  auto number = [](double v) -> nlohmann::json {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(std::to_string(v));
  };
  nlohmann::json j = {{"step", step},
                      {"skipped", true},
                      {"loss", number(loss)},
                      {"grad_norm", number(grad_norm)},
                      {"skipped_steps", skipped_steps}};
  out_ << j.dump() << "\n";
  out_.flush();
}

}  // namespace retort::engine
