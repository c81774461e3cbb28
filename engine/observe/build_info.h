// engine/observe/build_info.h: what this build of Retort is, for `--version` and the start-up
// banner: Retort's commit, the libtorch it was built on, whether the CUDA sources and the
// NCCL backend are compiled in (and whether a GPU is visible), and the BLAS library in use.
#pragma once
#include <string>

namespace retort::engine {

// Several lines: "retort <commit>", "libtorch ...", "CUDA ...", "BLAS ...".
std::string version_text();
// The same on one line, for the banner.
std::string build_summary();

}  // namespace retort::engine
