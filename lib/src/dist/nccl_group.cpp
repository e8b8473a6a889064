// See nccl_group.hpp. Compiled only with a CUDA LibTorch and nccl.h (lib/CMakeLists.txt).
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include "nccl_group.hpp"

#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/version.h>

namespace mltrain::dist::detail {

c10::intrusive_ptr<compat::C10dGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}

void shutdown_nccl_group(const c10::intrusive_ptr<compat::C10dGroup>& group) {
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(group.get())) nccl->shutdown();
}

std::string nccl_version() { return c10d::getNcclVersion(); }

}  // namespace mltrain::dist::detail
