// Built only with MLTRAIN_WITH_NCCL, in its own target so the c10d headers see LibTorch's own fmt
// rather than the system fmt 9 spdlog needs (third_party/dependencies.cmake).
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include "mltrain/dist/nccl_check.hpp"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace mltrain::dist {

bool nccl_compiled() { return true; }

NcclResult nccl_allreduce_check(double bytes, int iters) {
  NcclResult r;
  r.world = 1;
  r.bytes = bytes;
  try {
    r.version = c10d::getNcclVersion();
    const std::string path = "/tmp/mltrain_nccl_store_" + std::to_string(::getpid());
    std::remove(path.c_str());
    auto store = c10::make_intrusive<c10d::FileStore>(path, 1);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1, c10d::ProcessGroupNCCL::Options::create());
    std::vector<at::Tensor> t{torch::ones({static_cast<int64_t>(bytes / 4)}, torch::dtype(torch::kFloat32).device(torch::kCUDA, 0))};
    for (int i = 0; i < 3; ++i) pg->allreduce(t)->wait();
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) pg->allreduce(t)->wait();
    torch::cuda::synchronize();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    r.algbw_gbps = bytes / r.seconds / 1e9;
    r.busbw_gbps = r.algbw_gbps * 2.0 * (r.world - 1) / r.world;
    if (t[0][0].item<float>() != 1.0f) throw std::runtime_error("all-reduce over one rank changed the values");
    std::remove(path.c_str());
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = e.what();
    r.error = r.error.substr(0, r.error.find('\n'));
  }
  return r;
}

}  // namespace mltrain::dist
