# LibTorch from the venv (third_party/torch.cmake); everything else from Debian's packages
# (scripts/install-deps.sh). Nothing is downloaded at configure time.
include(${CMAKE_CURRENT_LIST_DIR}/torch.cmake)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)
find_package(PkgConfig)

if(MLTRAIN_CUDA)
  # Linkers that default to --as-needed would drop libtorch_cuda.so (nothing calls it by name),
  # and with it every CUDA kernel registration.
  add_link_options("LINKER:--no-as-needed")
  # ProcessGroupNCCL's header includes nccl.h: the wheel's own (site-packages/nvidia/nccl, the
  # NCCL libtorch_cuda.so loads) before the toolkit's.
  get_filename_component(_mltrain_site "${MLTRAIN_TORCH_ROOT}" DIRECTORY)
  find_path(MLTRAIN_NCCL_INCLUDE nccl.h HINTS ${MLTRAIN_NCCL_HINT} "${_mltrain_site}/nvidia/nccl/include"
            ENV NCCL_INCLUDE_DIR)
endif()

# Debian's spdlog 1.10 is built against the system fmt 9. The pip LibTorch ships its own, newer fmt
# headers (12.x) in its include folder, which spdlog must not see, or its calls would not link
# against libspdlog/libfmt 9. The system fmt's folder goes first: /usr/include itself cannot be
# moved ahead of the -isystem folders, so a folder in the build tree links to its fmt/ alone.
if(TARGET fmt::fmt)
  get_target_property(MLTRAIN_FMT_INC fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT MLTRAIN_FMT_INC)
    set(MLTRAIN_FMT_INC /usr/include)
  endif()
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/system-fmt)
  file(CREATE_LINK ${MLTRAIN_FMT_INC}/fmt ${CMAKE_BINARY_DIR}/system-fmt/fmt SYMBOLIC)
  include_directories(BEFORE SYSTEM ${CMAKE_BINARY_DIR}/system-fmt)
endif()

# yaml-cpp 0.7's config exports the target "yaml-cpp"; older ones only set YAML_CPP_LIBRARIES.
if(TARGET yaml-cpp)
  set(MLTRAIN_YAML_TARGET yaml-cpp)
else()
  set(MLTRAIN_YAML_TARGET ${YAML_CPP_LIBRARIES})
endif()

find_path(CATCH2_INCLUDE_DIR catch2/catch.hpp)
