// common/fault_injection.h: deliberate faults for the consistency suite's self-test
// (tests/consistency/consistency_faults.cpp). Each fault reproduces a class of real bug at
// the one place where that bug would live, so the test can show that the suite fails and
// names the tensor or term. Only test code sets a fault (set_injected_fault): no config
// key, environment variable or command-line flag of the engine's programs reaches it, and
// with no fault set every check below is one comparison of an enum.
#pragma once
#include <string>

namespace retort {

enum class Fault {
  None,
  TpNormGradNotSummed,      // norm-weight gradients not summed over TP under STP
  DpGradNotAveraged,        // DP gradients summed where the average is meant (x DP size)
  TiedSumSkipped,           // tied embedding gradients not summed across pipeline stages
  GradScaled,               // one parameter's gradient scaled by 1 + 1e-3
  GradMissing,              // one parameter's gradient never produced
  ActivationLocalTokens,    // activation loss normalised by this rank's micro-batch tokens
  LogitTermOneTpRank,       // the logit loss back-propagated on TP rank 0 only
  // The process kills itself (SIGKILL) inside a checkpoint save (tests/unit/checkpoint_*):
  KillAfterRankFiles,  // this rank's file written, the index not yet
  KillBeforeRename,    // the index written in the .partial directory, not yet renamed
  KillBeforeLatest,    // renamed into place, "latest" not yet updated
};

// The parameter GradScaled and GradMissing act on.
inline constexpr const char* kFaultParameter = "layers.1.mlp.down_proj.weight";

inline Fault& injected_fault_slot() {
  static Fault fault = Fault::None;
  return fault;
}
inline Fault injected_fault() { return injected_fault_slot(); }
inline bool fault_injected(Fault f) { return injected_fault_slot() == f; }
inline void set_injected_fault(Fault f) { injected_fault_slot() = f; }

}  // namespace retort
