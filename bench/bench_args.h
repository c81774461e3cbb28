// bench/bench_args.h: the benchmarks' positional counts (steps, threads, rounds, sequence
// length, ...). A missing argument takes its default; one that is not a whole number at least
// `least` ends the program with "error: ..." naming the position, its meaning and the text
// given, and exit 2, rather than reaching torch as 0 threads (which aborts with a c10 trace).
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace retort::bench {

inline int64_t count_argument(int argc, char** argv, int index, const char* meaning,
                              int64_t fallback, int64_t least = 1) {
  if (index >= argc) return fallback;
  const char* text = argv[index];
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || value < least) {
    std::fprintf(stderr,
                 "error: %s: argument %d (%s) must be a whole number >= %lld, got '%s'; key=value "
                 "settings go after the positional arguments\n",
                 argv[0], index, meaning, static_cast<long long>(least), text);
    std::exit(2);
  }
  return value;
}

}  // namespace retort::bench
