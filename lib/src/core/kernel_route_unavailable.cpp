// Built instead of kernel_route.cpp when no libdnnl is found (the pip/CUDA LibTorch, which links
// oneDNN statically). "onednn" then means LibTorch's own kernel, and describe() says so.
#include <spdlog/spdlog.h>

#include <mutex>

#include "mltrain/core/error.hpp"
#include "mltrain/core/runtime.hpp"

namespace mltrain::runtime {

void set_kernel_route(const std::string& route) {
  if (route != "onednn" && route != "native")
    throw ConfigError("runtime.kernel_route", "unknown kernel route '" + route + "'",
                      "use onednn or native");
  static std::once_flag once;
  if (route == "onednn")
    std::call_once(once, [] {
      spdlog::info(
          "[runtime] kernel_route=onednn: this build has no libdnnl to route to; LibTorch's own "
          "GEMM is used");
    });
}

std::string kernel_route() { return "native (no libdnnl in this build)"; }

}  // namespace mltrain::runtime
