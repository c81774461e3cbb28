// common/trace_span.h: a named span in the profiler's timeline (logging.
// profile_steps): a user-scope RecordFunction, so it lands beside torch's own op ranges in
// the Chrome trace. Costs one check of a flag when no profiler runs; the name is built only
// when one does.
#pragma once
#include <ATen/record_function.h>

#include <string>
#include <utility>

namespace retort {

class TraceSpan {
 public:
  // `name()` is called only while profiling.
  template <typename MakeName>
  explicit TraceSpan(MakeName&& name) : scope_(at::RecordScope::USER_SCOPE) {
    if (scope_.isActive()) scope_.before(std::string(std::forward<MakeName>(name)()));
  }

  // Ends the span before the end of its C++ scope.
  void end() { scope_.end(); }

 private:
  at::RecordFunction scope_;
};

}  // namespace retort
