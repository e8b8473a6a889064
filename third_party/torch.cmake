# LibTorch from the project's virtual environment: the torch 2.15 wheel from PyPI that
# scripts/venv.sh installs (its share/cmake/Torch). Sets TORCH_LIBRARIES, TORCH_INCLUDE_DIRS,
# Torch_VERSION, MLTRAIN_TORCH_CUDA (the CUDA version the wheel was built with, "" for a CPU wheel),
# MLTRAIN_TORCH_CPU (an interface target: LibTorch's headers with libtorch_cpu.so and libc10.so
# only, what the engine and the mltrain binary link; TORCH_LIBRARIES, with the CUDA libraries, is
# for the CUDA plugin and the NCCL helper alone: lib/include/mltrain/runtime/cuda_plugin.hpp)
# and decides MLTRAIN_WITH_CUDA:
#
#   AUTO (default)  CUDA on when the wheel has CUDA and an nvcc of the same major version is found
#   ON              the same, but a missing or mismatched nvcc is an error
#   OFF             the CPU-only binary
#
# Bad environments stop with one line starting "mltrain: error:" (scripts/build.sh prints that
# line alone and exits 2) naming what was found, what is needed and the command that fixes it.

set(MLTRAIN_TORCH_SERIES "2.15" CACHE STRING "the LibTorch minor series mltrain builds against")
set(MLTRAIN_TORCH_ROOT "" CACHE PATH "the torch package folder (default: .venv's site-packages/torch)")
set(MLTRAIN_WITH_CUDA AUTO CACHE STRING "AUTO | ON | OFF: compile the CUDA code paths")
set_property(CACHE MLTRAIN_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)

# NOTICE prints the line as it is (FATAL_ERROR's text is wrapped), then configuration stops.
function(mltrain_env_error what)
  message(NOTICE "mltrain: error: ${what}")
  message(FATAL_ERROR "mltrain: the environment above does not fit the build")
endfunction()

if(NOT MLTRAIN_TORCH_ROOT)
  file(GLOB _mltrain_roots "${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/torch")
  list(LENGTH _mltrain_roots _n)
  if(_n EQUAL 0)
    mltrain_env_error("no torch in ${PROJECT_SOURCE_DIR}/.venv; need torch ${MLTRAIN_TORCH_SERIES} from PyPI (fix: bash scripts/setup.sh)")
  endif()
  list(GET _mltrain_roots 0 _root)
  set(MLTRAIN_TORCH_ROOT "${_root}" CACHE PATH "the torch package folder" FORCE)
endif()
set(_root "${MLTRAIN_TORCH_ROOT}")
if(NOT EXISTS "${_root}/version.py" OR NOT EXISTS "${_root}/share/cmake/Torch/TorchConfig.cmake")
  mltrain_env_error("${_root} is not a torch wheel with LibTorch (no version.py or share/cmake/Torch); need torch ${MLTRAIN_TORCH_SERIES} from PyPI (fix: bash scripts/venv.sh)")
endif()

# version.py, not `import torch`: reading it takes no time and needs no working Python.
file(STRINGS "${_root}/version.py" _ver REGEX "^__version__")
file(STRINGS "${_root}/version.py" _cuda REGEX "^cuda")
string(REGEX REPLACE ".*'([0-9]+\\.[0-9]+)[^']*'.*" "\\1" _series "${_ver}")
string(REGEX REPLACE ".*'([^']*)'.*" "\\1" _full "${_ver}")
set(MLTRAIN_TORCH_CUDA "")
if(_cuda MATCHES "'([0-9]+\\.[0-9]+)'")
  set(MLTRAIN_TORCH_CUDA "${CMAKE_MATCH_1}")
endif()
if(NOT _series STREQUAL MLTRAIN_TORCH_SERIES)
  mltrain_env_error("torch ${_full} in ${_root}; need ${MLTRAIN_TORCH_SERIES}.x (fix: bash scripts/venv.sh, which installs scripts/requirements.txt)")
endif()

# Which nvcc, and does its major version match the wheel's CUDA?
set(_want_cuda OFF)
if(NOT MLTRAIN_WITH_CUDA STREQUAL "OFF")
  if(NOT MLTRAIN_TORCH_CUDA)
    if(MLTRAIN_WITH_CUDA STREQUAL "ON")
      mltrain_env_error("torch ${_full} is a CPU-only wheel, so MLTRAIN_WITH_CUDA=ON cannot be met (fix: install the CUDA wheel from scripts/requirements.txt, or -DMLTRAIN_WITH_CUDA=OFF)")
    endif()
  else()
    # -DMLTRAIN_NVCC=/path/to/nvcc picks one; a path that does not exist means "no nvcc".
    find_program(MLTRAIN_NVCC nvcc HINTS ENV CUDA_PATH ENV CUDA_HOME PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin)
    if(NOT MLTRAIN_NVCC OR NOT EXISTS "${MLTRAIN_NVCC}")
      if(MLTRAIN_WITH_CUDA STREQUAL "ON")
        mltrain_env_error("no nvcc found, and MLTRAIN_WITH_CUDA=ON; need the CUDA ${MLTRAIN_TORCH_CUDA} toolkit the wheel was built with (fix: put CUDA's bin/ on PATH, or -DMLTRAIN_WITH_CUDA=OFF)")
      endif()
      message(NOTICE "mltrain: no nvcc found: building the CPU-only binary (install the CUDA ${MLTRAIN_TORCH_CUDA} toolkit for the CUDA build)")
    else()
      execute_process(COMMAND "${MLTRAIN_NVCC}" --version OUTPUT_VARIABLE _nv ERROR_QUIET)
      string(REGEX MATCH "release ([0-9]+)\\.([0-9]+)" _m "${_nv}")
      set(MLTRAIN_NVCC_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
      set(_nvcc_major "${CMAKE_MATCH_1}")
      string(REGEX MATCH "^[0-9]+" _torch_major "${MLTRAIN_TORCH_CUDA}")
      if(NOT _nvcc_major STREQUAL _torch_major)
        mltrain_env_error("nvcc ${MLTRAIN_NVCC_VERSION} (${MLTRAIN_NVCC}) does not match the torch wheel's CUDA ${MLTRAIN_TORCH_CUDA}; need a CUDA ${_torch_major}.x toolkit (fix: put CUDA ${_torch_major}'s bin/ first on PATH and delete build/, or -DMLTRAIN_WITH_CUDA=OFF)")
      endif()
      set(_want_cuda ON)
    endif()
  endif()
endif()
set(MLTRAIN_CUDA ${_want_cuda})

if(MLTRAIN_CUDA)
  # Torch's own config finds the CUDA toolkit (the nvcc checked above) and its libraries. The
  # torch folder goes first on the prefix path, or find_library could pick another libtorch.so
  # (Debian's libtorch-dev puts one in /usr/lib).
  get_filename_component(_cuda_root "${MLTRAIN_NVCC}" DIRECTORY)
  get_filename_component(_cuda_root "${_cuda_root}" DIRECTORY)
  set(CUDAToolkit_ROOT "${_cuda_root}")
  set(CMAKE_CUDA_COMPILER "${MLTRAIN_NVCC}")
  if(NOT TORCH_CUDA_ARCH_LIST)
    # What the wheel ships kernels for; only our own .cu files (none today) would use it.
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${_root}")
  find_package(Torch REQUIRED PATHS "${_root}/share/cmake/Torch" NO_DEFAULT_PATH)
  foreach(_lib ${TORCH_LIBRARY} ${C10_LIBRARY})
    string(FIND "${_lib}" "${_root}" _at)
    if(NOT _at EQUAL 0)
      mltrain_env_error("LibTorch resolved to ${_lib}, outside ${_root} (fix: remove the other LibTorch, e.g. apt-get remove libtorch-dev, and delete build/)")
    endif()
  endforeach()
else()
  # A CUDA wheel's TorchConfig insists on a CUDA toolkit, so the CPU-only binary takes the wheel's
  # libraries directly (below).
  set(TORCH_LIBRARIES "")
  set(TORCH_INCLUDE_DIRS "${_root}/include" "${_root}/include/torch/csrc/api/include")
  set(Torch_VERSION "${_series}.0")
endif()
# The engine links LibTorch's CPU half only: not libtorch.so, whose DT_NEEDED pulls in
# libtorch_cuda.so and every CUDA library with it (their relocations cost each process ~0.14 s
# and ~370 MB of resident pages on a CPU node). CUDA builds load that half as a plugin.
add_library(mltrain_torch_cpu INTERFACE)
target_include_directories(mltrain_torch_cpu SYSTEM INTERFACE "${_root}/include"
                           "${_root}/include/torch/csrc/api/include")
target_link_libraries(mltrain_torch_cpu INTERFACE "${_root}/lib/libtorch_cpu.so" "${_root}/lib/libc10.so")
set(MLTRAIN_TORCH_CPU mltrain_torch_cpu)
# The OpenMP runtime libtorch_cpu.so was built with and loads (the wheel ships its own libgomp.so.1),
# for runtime/parallel.cpp's OpenMP calls; the toolchain's libgomp where a build of LibTorch has none.
if(EXISTS "${_root}/lib/libgomp.so.1")
  set(MLTRAIN_TORCH_OPENMP "${_root}/lib/libgomp.so.1")
else()
  set(MLTRAIN_TORCH_OPENMP gomp)
endif()
# The wheel's CUDA libraries (NCCL, cuDNN, cuBLAS, ... under site-packages/nvidia/*/lib) are what
# libtorch_cuda.so was built against and finds at run time through its own RUNPATH. The linker and
# our binaries must see them first too: an older NCCL or nvrtc in /usr/local/cuda/lib64 would leave
# libtorch_cuda.so's newer symbols unresolved, or load first under the same soname.
get_filename_component(_site "${_root}" DIRECTORY)
file(GLOB _nv_libs "${_site}/nvidia/*/lib")
# A wheel build (MLTRAIN_WHEEL) links against them the same way but records no absolute path: its
# binaries find them relative to themselves (packaging/install.cmake).
foreach(_d ${_nv_libs})
  add_link_options("LINKER:-rpath-link,${_d}")
  if(NOT MLTRAIN_WHEEL)
    add_link_options("LINKER:-rpath,${_d}")
  endif()
endforeach()
message(STATUS "mltrain: LibTorch ${_full} from ${_root}; CUDA ${MLTRAIN_CUDA} (wheel CUDA '${MLTRAIN_TORCH_CUDA}', nvcc '${MLTRAIN_NVCC_VERSION}')")
