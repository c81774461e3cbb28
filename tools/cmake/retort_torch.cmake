# tools/cmake/retort_torch.cmake: finds the libtorch Retort builds on (the PyPI wheel's) and
# the OpenMP runtime our parallel regions run on (the wheel's own libgomp).

# libtorch is the one in the PyPI torch wheel of tools/setup.sh's Python environment
# (tools/requirements.txt pins it): CMake is pointed at it through the wheel's own
# torch.utils.cmake_prefix_path. RETORT_PYTHON names another interpreter with torch.
if(DEFINED ENV{RETORT_VENV})
  set(retort_default_python "$ENV{RETORT_VENV}/bin/python")
else()
  set(retort_default_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
endif()
set(RETORT_PYTHON "${retort_default_python}" CACHE FILEPATH
    "The Python with the torch wheel whose libtorch Retort builds on (tools/setup.sh makes it)")
execute_process(
  COMMAND "${RETORT_PYTHON}" -c "import torch, torch.utils; print(torch.utils.cmake_prefix_path + ';' + torch.__version__)"
  OUTPUT_VARIABLE retort_torch_query OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_VARIABLE retort_torch_error RESULT_VARIABLE retort_torch_status)
if(NOT retort_torch_status EQUAL 0)
  message(FATAL_ERROR "RETORT_PYTHON=${RETORT_PYTHON} cannot import torch (run tools/setup.sh, "
                      "or pass -DRETORT_PYTHON=<a python with torch>): ${retort_torch_error}")
endif()
list(GET retort_torch_query 0 retort_torch_prefix)
list(GET retort_torch_query 1 RETORT_TORCH_VERSION)
# The wheel's torch folder too (its lib/ holds libtorch, libc10, ...): TorchConfig finds its
# libraries with find_library(... PATHS <torch>/lib), which searches the system's folders
# first, so a distribution's libtorch (Debian's libtorch-dev: libc10.so) would be taken
# beside the wheel's headers and libtorch_cpu, and two c10s would abort at start-up.
get_filename_component(retort_torch_root "${retort_torch_prefix}/../.." ABSOLUTE)
list(PREPEND CMAKE_PREFIX_PATH "${retort_torch_prefix}" "${retort_torch_root}")
find_package(Torch REQUIRED)
# The wheel's libtorch.so and libtorch_cpu.so export their own copies of parts of libstdc++
# (std::filesystem, std::chrono's time zones: built with a newer GCC and linked statically
# into them). Found first, libtorch's std::filesystem::remove_all called a null pointer here.
# Naming libstdc++ before every other library makes the loader bind those symbols to the
# system's libstdc++, for our code and libtorch's alike.
add_link_options(LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state)

# Torch's at::parallel_for is a header template whose `omp parallel` is compiled into the
# caller: without -fopenmp every parallel loop of ours (fused kernels, AdamW, the heads' row
# loops, attention) ran on one thread. Those regions must run on libtorch's own OpenMP
# runtime, the libgomp.so.1 the wheel ships beside libtorch: linking GCC's own as well would
# leave the process with whichever the loader met first, so retort_openmp names torch's.
find_library(RETORT_TORCH_GOMP NAMES libgomp.so.1 PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
if(NOT RETORT_TORCH_GOMP)
  find_package(OpenMP REQUIRED COMPONENTS CXX)  # a libtorch linked against the system's libgomp
  set(RETORT_TORCH_GOMP OpenMP::OpenMP_CXX)
endif()
add_library(retort_openmp INTERFACE)
target_compile_options(retort_openmp INTERFACE -fopenmp)
target_link_libraries(retort_openmp INTERFACE ${RETORT_TORCH_GOMP})

# Every library of the Torch package must be the wheel's (see CMAKE_PREFIX_PATH above).
foreach(retort_torch_lib ${TORCH_LIBRARY} ${c10_LIBRARY})
  string(FIND "${retort_torch_lib}" "${retort_torch_root}" retort_torch_lib_at)
  if(NOT retort_torch_lib_at EQUAL 0)
    message(FATAL_ERROR "Torch library ${retort_torch_lib} is not the wheel's (${retort_torch_root}/lib)")
  endif()
endforeach()
