// tests/unit/process_runtimes_test.cpp: a Retort process holds one runtime of each kind. The
// PyPI wheel brings its own OpenMP runtime (torch/lib/libgomp.so.1) and its BLAS (MKL, linked
// into libtorch_cpu), and NCCL from nvidia-nccl-cu13; after a product and a parallel region,
// /proc/self/maps must show exactly one OpenMP runtime, no BLAS library beside libtorch's
// (OpenBLAS, the reference BLAS, MKL's own shared libraries), at most one NCCL, and the
// BLAS symbol our kernels call (sgemm_) must come from libtorch_cpu.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>

namespace {

// The distinct files mapped into this process whose base name matches `pattern`.
std::set<std::string> mapped_files(const std::string& pattern) {
  const std::regex name(pattern);
  std::set<std::string> files;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (std::regex_search(path.substr(path.rfind('/') + 1), name)) files.insert(path);
  }
  return files;
}

std::string describe(const std::set<std::string>& files) {
  std::string text;
  for (const std::string& f : files) text += "\n  " + f;
  return text;
}

}  // namespace

TEST(ProcessRuntimes, OneOpenMpRuntimeOneBlasOneNccl) {
  torch::Tensor a = torch::randn({256, 256});
  torch::Tensor product = torch::mm(a, a);  // the BLAS, on OpenMP's threads
  at::parallel_for(0, 1024, 1, [&](int64_t, int64_t) {});
  EXPECT_GT(product.abs().sum().item<double>(), 0.0);

  const auto openmp = mapped_files("^lib(gomp|iomp5|omp)[-.]");
  EXPECT_EQ(openmp.size(), 1u) << "OpenMP runtimes:" << describe(openmp);
  const auto other_blas = mapped_files("^lib(openblas|blas|cblas|mkl_)");
  EXPECT_TRUE(other_blas.empty()) << "BLAS libraries beside libtorch's:" << describe(other_blas);
  const auto nccl = mapped_files("^libnccl");
  EXPECT_LE(nccl.size(), 1u) << "NCCL libraries:" << describe(nccl);

  Dl_info where{};
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  ASSERT_NE(sgemm, nullptr);
  ASSERT_NE(dladdr(sgemm, &where), 0);
  EXPECT_NE(std::string(where.dli_fname).find("libtorch_cpu"), std::string::npos)
      << "sgemm_ comes from " << where.dli_fname;
}
