# tools/cmake/retort_cuda.cmake: decides RETORT_WITH_CUDA (the CUDA sources and the NCCL
# backend) from the libtorch found and the wheel's NCCL, and says so in one line.

# The CUDA sources and the NCCL backend: compiled whenever this libtorch is built with CUDA
# (the PyPI wheel is) and NCCL is found, so every build, CI's included, compiles them; they
# run only where a GPU is. NCCL is the one the wheel ships (nvidia-nccl-cu13), the library
# torch_cuda itself loads, so a process holds one NCCL whichever of the two asks first.
set(RETORT_WITH_CUDA OFF)
set(retort_no_cuda_reason "RETORT_NCCL=OFF")
if(NOT RETORT_NCCL STREQUAL "OFF")
  set(retort_no_cuda_reason "")
  if(NOT TORCH_CUDA_LIBRARIES)
    set(retort_no_cuda_reason "the libtorch found (${Torch_DIR}) is CPU-only")
  else()
    execute_process(
      COMMAND "${RETORT_PYTHON}" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
      OUTPUT_VARIABLE retort_nccl_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    find_path(NCCL_INCLUDE_DIR nccl.h PATHS "${retort_nccl_root}/include" NO_DEFAULT_PATH)
    find_library(NCCL_LIBRARY NAMES libnccl.so.2 PATHS "${retort_nccl_root}/lib" NO_DEFAULT_PATH)
    if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
      set(retort_no_cuda_reason "NCCL not found (nccl.h, libnccl.so.2)")
    endif()
  endif()
  if(retort_no_cuda_reason STREQUAL "")
    set(RETORT_WITH_CUDA ON)
  elseif(RETORT_NCCL STREQUAL "ON")
    message(FATAL_ERROR "RETORT_NCCL=ON: ${retort_no_cuda_reason}")
  endif()
endif()
if(RETORT_WITH_CUDA)
  message(STATUS "Retort: CUDA sources and NCCL backend compiled (libtorch ${RETORT_TORCH_VERSION}, "
                 "CUDA ${CUDAToolkit_VERSION}, ${NCCL_LIBRARY})")
else()
  message(STATUS "Retort: CUDA sources and NCCL backend not compiled (libtorch "
                 "${RETORT_TORCH_VERSION}: ${retort_no_cuda_reason})")
endif()
