// layers/param_spec.cpp: see param_spec.h.
#include "layers/param_spec.h"

namespace retort::layers {

uint64_t parameter_seed(uint64_t run_seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the name
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = h ^ (run_seed + 0x9e3779b97f4a7c15ull);  // splitmix64 finaliser mixes in seed
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace retort::layers
