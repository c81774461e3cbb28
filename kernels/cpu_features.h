// kernels/cpu_features.h: the instruction sets our hand-vectorised loops may use, detected
// once per process. RETORT_KERNEL_ISA (baseline, avx2 or avx512) caps what is detected, so a
// machine with AVX-512 can run the fallbacks (the tile products through the BLAS, the
// attention's softmax through the portable exp): the tests run that way too, rather than
// assuming the fallbacks work. The cap also picks which compiled variant of each row loop runs
// (kernels/isa_variants.h), so the baseline variants are tested on this machine too.
#pragma once
#include <string>

namespace retort::kernels {

enum class Isa { baseline, avx2, avx512 };

// The widest set this CPU has, capped by RETORT_KERNEL_ISA. An unknown value of the variable
// stops the process with one line naming it.
Isa kernel_isa();
const char* isa_name(Isa isa);

// Which CPU this is, for figures that must name their machine and for per-machine caches:
// "AuthenticAMD family 25 model 17 (AMD EPYC 9R14), avx512, 2 cores" from CPUID (family and
// model as Linux prints them), the kernel ISA in use and the cores this process may run on.
std::string cpu_signature();

// The cores this process may run on (its affinity mask), at least 1.
int available_cores();

}  // namespace retort::kernels
