# System packages only (scripts/install-deps.sh installs them); nothing is downloaded at configure time.
find_package(Torch REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)
find_package(PkgConfig)

# Debian's LibTorch links the system oneDNN; mltrain calls its sgemm directly (core/kernel_route.cpp).
# The pip/CUDA LibTorch links oneDNN statically and exports no sgemm: there the route is not
# compiled and runtime.kernel_route=onednn falls back to LibTorch's own kernel (which in those
# builds is MKL/OpenBLAS, already fast).
find_library(MLTRAIN_DNNL_LIB NAMES dnnl libdnnl.so.2)
if(NOT MLTRAIN_DNNL_LIB)
  message(STATUS "mltrain: no libdnnl found; the oneDNN kernel route is not compiled")
  set(MLTRAIN_DNNL_LIB "")
endif()

# LibTorch 2.13 and later need C++20 in their headers; 1.13 .. 2.12 are fine with C++17.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.13 AND CMAKE_CXX_STANDARD LESS 20)
  set(CMAKE_CXX_STANDARD 20)
endif()

if(MLTRAIN_WITH_CUDA)
  # Linkers that default to --as-needed would drop libtorch_cuda.so (nothing calls it by name),
  # and with it every CUDA kernel registration.
  add_link_options("LINKER:--no-as-needed")
  # ProcessGroupNCCL's header includes nccl.h; pip wheels keep it under site-packages/nvidia/nccl.
  find_path(MLTRAIN_NCCL_INCLUDE nccl.h HINTS ${MLTRAIN_NCCL_HINT} ENV NCCL_INCLUDE_DIR)
endif()

# Debian's spdlog 1.10 is built against the system fmt 9. The pip LibTorch 2.x ships its own,
# newer fmt headers in its include folder, which spdlog must not see: when fmt lives outside
# /usr/include (the carried .devdeps bundle on a GPU machine), its folder goes first.
if(TARGET fmt::fmt)
  get_target_property(MLTRAIN_FMT_INC fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  if(MLTRAIN_FMT_INC AND NOT MLTRAIN_FMT_INC STREQUAL "/usr/include")
    include_directories(BEFORE SYSTEM ${MLTRAIN_FMT_INC})
  endif()
endif()

# yaml-cpp 0.7's config exports the target "yaml-cpp"; older ones only set YAML_CPP_LIBRARIES.
if(TARGET yaml-cpp)
  set(MLTRAIN_YAML_TARGET yaml-cpp)
else()
  set(MLTRAIN_YAML_TARGET ${YAML_CPP_LIBRARIES})
endif()

find_path(CATCH2_INCLUDE_DIR catch2/catch.hpp)
