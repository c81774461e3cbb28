// common/torch_pch.h: the precompiled header shared by every translation unit that uses
// torch. Compiling <torch/torch.h> costs ~20 s, so it is compiled once (see CMakeLists.txt).
#pragma once
#include <torch/torch.h>
