#pragma once
// The NCCL process group behind Comm (distributed.backend=nccl). Its definition, nccl_group.cpp,
// is compiled only with a CUDA LibTorch and nccl.h, in its own object library with LibTorch's
// include order (the c10d NCCL headers must see LibTorch's bundled fmt, not the system one that
// spdlog needs); ddp.cpp calls it only when MLTRAIN_WITH_NCCL_PG is defined.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "mltrain/runtime/compat.hpp"

namespace mltrain::dist::detail {

c10::intrusive_ptr<compat::C10dGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      std::chrono::milliseconds timeout);
// LibTorch 2.3+: stops the group's watchdog before its destructor runs (without it the
// destructor warns and can block at exit). Earlier versions: nothing.
void shutdown_nccl_group(const c10::intrusive_ptr<compat::C10dGroup>& group);
std::string nccl_version();

}  // namespace mltrain::dist::detail
