// mltrain_nccl_check: an NCCL process group through c10d (a world of one on cuda:0) and a timed
// all-reduce, printed as one JSON line. `mltrain checklist` runs it as a child process with a
// timeout, so a hung or crashing NCCL cannot take the checklist with it, and the c10d NCCL
// headers' static state stays out of the main binary. Built only with a CUDA LibTorch and nccl.h,
// with LibTorch's own include order (its bundled fmt, not the system one spdlog needs).
//
//   mltrain_nccl_check BYTES ITERS
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

static std::string quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

int main(int argc, char** argv) {
  const double bytes = argc > 1 ? std::stod(argv[1]) : 256.0 * (1 << 20);
  const int iters = argc > 2 ? std::stoi(argv[2]) : 10;
  std::string version, error;
  double seconds = 0;
  bool ok = false;
  const int world = 1;
  try {
    version = c10d::getNcclVersion();
    const std::string path = "/tmp/mltrain_nccl_store_" + std::to_string(::getpid());
    std::remove(path.c_str());
    auto store = c10::make_intrusive<c10d::FileStore>(path, world);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        store, 0, world, c10d::ProcessGroupNCCL::Options::create());
    std::vector<at::Tensor> t{torch::ones({static_cast<int64_t>(bytes / 4)},
                                          torch::dtype(torch::kFloat32).device(torch::kCUDA, 0))};
    for (int i = 0; i < 3; ++i) pg->allreduce(t)->wait();
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) pg->allreduce(t)->wait();
    torch::cuda::synchronize();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    if (t[0][0].item<float>() != 1.0f)
      throw std::runtime_error("all-reduce over one rank changed the values");
    pg->shutdown();  // without it the destructor warns and can block on the watchdog
    std::remove(path.c_str());
    ok = true;
  } catch (const std::exception& e) {
    error = e.what();
    error = error.substr(0, error.find('\n'));
  }
  const double algbw = seconds > 0 ? bytes / seconds / 1e9 : 0;
  std::cout << "{\"ok\":" << (ok ? "true" : "false") << ",\"version\":" << quote(version)
            << ",\"world\":" << world << ",\"bytes\":" << bytes << ",\"seconds\":" << seconds
            << ",\"algbw_gbps\":" << algbw
            << ",\"busbw_gbps\":" << algbw * 2.0 * (world - 1) / world
            << ",\"error\":" << quote(error) << "}" << std::endl;
  std::_Exit(ok ? 0 : 1);  // skip NCCL/CUDA teardown: the answer is out
}
