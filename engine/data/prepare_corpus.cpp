// engine/data/prepare_corpus.cpp: see prepare_corpus.h.
#include "engine/data/prepare_corpus.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/user_error.h"

namespace fs = std::filesystem;

namespace retort::engine {
namespace {

struct Unit {
  fs::path file;
  int64_t begin = 0, end = 0;  // byte range; a .txt unit is the whole file
  bool jsonl = false;
};

std::vector<Unit> make_units(const std::vector<fs::path>& files, int64_t chunk_bytes) {
  std::vector<Unit> units;
  for (const fs::path& file : files) {
    const int64_t size = int64_t(fs::file_size(file));
    if (file.extension() != ".jsonl") {
      units.push_back({file, 0, size, false});
      continue;
    }
    std::ifstream in(file, std::ios::binary);
    int64_t begin = 0;
    while (begin < size) {
      int64_t end = std::min(size, begin + std::max<int64_t>(chunk_bytes, 1));
      if (end < size) {  // move to just past the next line end
        in.seekg(end - 1);
        std::string rest;
        std::getline(in, rest);
        end = std::min(size, end + int64_t(rest.size()));
      }
      units.push_back({file, begin, end, true});
      begin = end;
    }
  }
  return units;
}

// The 1-based line of byte `offset` in `file` (for error messages only).
int64_t line_of(const fs::path& file, int64_t offset) {
  std::ifstream in(file, std::ios::binary);
  int64_t line = 1;
  for (int64_t i = 0; i < offset && in; ++i)
    if (in.get() == '\n') ++line;
  return line;
}

PrepareStats process_unit(const Unit& unit, const DocumentEncoder& encode,
                          IndexedDatasetWriter& writer) {
  std::ifstream in(unit.file, std::ios::binary);
  if (!in) throw UserError("cannot read '" + unit.file.string() + "'");
  in.seekg(unit.begin);
  std::string text(size_t(unit.end - unit.begin), '\0');
  in.read(text.data(), std::streamsize(text.size()));
  PrepareStats stats;
  stats.bytes = unit.end - unit.begin;
  auto add = [&](const std::string& document) {
    const std::vector<int64_t> ids = encode(document);
    stats.tokens += int64_t(ids.size());
    ++stats.documents;
    if (document.find_first_not_of(" \t\r\n") == std::string::npos) ++stats.empty_documents;
    writer.add_document(ids);
  };
  if (!unit.jsonl) {
    add(text);
    return stats;
  }
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string())
        throw UserError(unit.file.string() + ":" +
                        std::to_string(line_of(unit.file, unit.begin + int64_t(at))) +
                        ": expected a JSON object with a string field \"text\"");
      add(j["text"].get<std::string>());
    }
    at = end + 1;
  }
  return stats;
}

class Progress {
 public:
  Progress(int64_t total, bool on) : total_(std::max<int64_t>(total, 1)), on_(on) {
    terminal_ = isatty(fileno(stderr));
  }
  void update(const PrepareStats& done) {
    if (!on_) return;
    const int tenth = int(done.bytes * 10 / total_);
    if (!terminal_ && tenth == last_tenth_) return;
    last_tenth_ = tenth;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "%sprepare: %5.1f%% of %.1f MB, %lld documents, %lld tokens, %.1f MB/s%s",
                 terminal_ ? "\r" : "", 100.0 * double(done.bytes) / double(total_),
                 double(total_) / 1e6, (long long)done.documents, (long long)done.tokens,
                 double(done.bytes) / 1e6 / std::max(seconds, 1e-9), terminal_ ? "" : "\n");
  }
  void finish() {
    if (on_ && terminal_) std::fprintf(stderr, "\n");
  }

 private:
  int64_t total_;
  bool on_, terminal_ = false;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

std::string part_prefix(const std::string& output, size_t unit) {
  return output + ".part" + std::to_string(unit);
}

// What a worker tells the parent after each unit (written whole: smaller than PIPE_BUF).
struct Report {
  int64_t unit, bytes, documents, tokens, empty_documents;
};

}  // namespace

PrepareStats prepare_corpus(const std::vector<fs::path>& files, const DocumentEncoder& encode,
                            const PrepareOptions& options) {
  const std::vector<Unit> units = make_units(files, options.chunk_bytes);
  int64_t total = 0;
  for (const Unit& u : units) total += u.end - u.begin;
  Progress progress(total, options.progress);
  PrepareStats done;
  const int workers = std::max(1, std::min<int>(options.workers, int(units.size())));
  if (workers == 1) {
    IndexedDatasetWriter writer(options.output, options.dtype);
    for (const Unit& unit : units) {
      const PrepareStats s = process_unit(unit, encode, writer);
      done.bytes += s.bytes, done.documents += s.documents, done.tokens += s.tokens;
      done.empty_documents += s.empty_documents;
      progress.update(done);
    }
    writer.finish();
    progress.finish();
    return done;
  }
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) throw UserError("cannot create a pipe for the workers");
  std::cout.flush();
  std::vector<pid_t> children;
  for (int w = 0; w < workers; ++w) {
    const pid_t pid = fork();
    if (pid < 0) throw UserError("cannot start worker " + std::to_string(w));
    if (pid > 0) {
      children.push_back(pid);
      continue;
    }
    close(pipe_fds[0]);
    int status = 0;
    try {
      for (size_t u = size_t(w); u < units.size(); u += size_t(workers)) {
        IndexedDatasetWriter writer(part_prefix(options.output, u), options.dtype);
        const PrepareStats s = process_unit(units[u], encode, writer);
        writer.finish();
        const Report report{int64_t(u), s.bytes, s.documents, s.tokens, s.empty_documents};
        if (write(pipe_fds[1], &report, sizeof report) != ssize_t(sizeof report)) status = 3;
      }
    } catch (const UserError& e) {
      std::cerr << "error: " << e.what() << std::endl;
      status = 2;
    }
    close(pipe_fds[1]);
    _exit(status);
  }
  close(pipe_fds[1]);
  Report report{};
  size_t reported = 0;
  while (read(pipe_fds[0], &report, sizeof report) == ssize_t(sizeof report)) {
    ++reported;
    done.bytes += report.bytes, done.documents += report.documents, done.tokens += report.tokens;
    done.empty_documents += report.empty_documents;
    progress.update(done);
  }
  close(pipe_fds[0]);
  bool failed = false;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed = failed || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  progress.finish();
  auto remove_parts = [&] {
    for (size_t u = 0; u < units.size(); ++u)
      for (const char* ext : {".bin", ".idx"}) fs::remove(part_prefix(options.output, u) + ext);
  };
  if (failed || reported != units.size()) {
    remove_parts();
    throw UserError("a preparation worker failed (its error is above); nothing was written");
  }
  // The parts in unit order: the dataset one worker would have written.
  IndexedDatasetWriter writer(options.output, options.dtype);
  std::vector<int64_t> ids;
  for (size_t u = 0; u < units.size(); ++u) {
    const IndexedDataset part(part_prefix(options.output, u));
    for (int64_t seq = 0; seq < part.sequence_count(); ++seq) {
      ids.resize(size_t(part.sequence_length(seq)));
      part.read(seq, 0, int64_t(ids.size()), ids.data());
      writer.add_document(ids);
    }
  }
  writer.finish();
  remove_parts();
  return done;
}

}  // namespace retort::engine
