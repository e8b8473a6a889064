# System packages only (scripts/install-deps.sh installs them); nothing is downloaded at configure time.
find_package(Torch REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)

# Debian's LibTorch links the system oneDNN; mltrain calls its sgemm directly (core/kernel_route.cpp).
find_library(MLTRAIN_DNNL_LIB NAMES dnnl libdnnl.so.2 REQUIRED)

# yaml-cpp 0.7's config exports the target "yaml-cpp"; older ones only set YAML_CPP_LIBRARIES.
if(TARGET yaml-cpp)
  set(MLTRAIN_YAML_TARGET yaml-cpp)
else()
  set(MLTRAIN_YAML_TARGET ${YAML_CPP_LIBRARIES})
endif()

find_path(CATCH2_INCLUDE_DIR catch2/catch.hpp)
