// libmltrain_cuda.so: the CUDA half of the engine (mltrain/runtime/cuda_plugin.hpp). Built only
// with a CUDA LibTorch, linked against libtorch_cuda.so and the CUDA libraries, and compiled with
// LibTorch's own include order (lib/CMakeLists.txt): the c10d NCCL headers must see LibTorch's
// bundled fmt, not the system one spdlog needs. It holds no mltrain state and includes no other
// mltrain header, so a process has one copy of everything else.
#ifdef MLTRAIN_WITH_NCCL_PG
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>

#include <mutex>

#include "mltrain/runtime/cuda_plugin.hpp"

namespace {
namespace compat = mltrain::compat;

bool available() { return torch::cuda::is_available(); }
int device_count() { return available() ? static_cast<int>(torch::cuda::device_count()) : 0; }
void set_device(int index) {
  if (available()) c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
}
void synchronize() {
  if (available()) torch::cuda::synchronize();
}

compat::CudaMemory memory(int device) {
  compat::CudaMemory m;
  if (!available()) return m;
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const size_t agg = 0;  // StatType::AGGREGATE
  m.allocated = s.allocated_bytes[agg].current;
  m.reserved = s.reserved_bytes[agg].current;
  m.peak_allocated = s.allocated_bytes[agg].peak;
  return m;
}
int64_t total_memory(int device) {
  return available() ? static_cast<int64_t>(at::cuda::getDeviceProperties(device)->totalGlobalMem)
                     : 0;
}
void reset_peak(int device) {
  if (available()) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
}
std::string device_name(int device) {
  return available() ? at::cuda::getDeviceProperties(device)->name : "";
}
std::string cudnn_version() {
  try {
    if (available()) return std::to_string(at::detail::getCUDAHooks().versionCuDNN());
  } catch (const std::exception&) {
  }
  return "";
}

torch::Tensor rng_state() {
  if (!available()) return {};
  auto gen = at::cuda::detail::getDefaultCUDAGenerator(0);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_rng_state(const torch::Tensor& state) {
  if (!available() || !state.defined()) return;
  auto gen = at::cuda::detail::getDefaultCUDAGenerator(0);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void* event_create() { return new at::cuda::CUDAEvent(); }
void event_record(void* e, int device) {
  static_cast<at::cuda::CUDAEvent*>(e)->record(
      at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)));
}
void event_synchronize(void* e) { static_cast<at::cuda::CUDAEvent*>(e)->synchronize(); }
void event_destroy(void* e) { delete static_cast<at::cuda::CUDAEvent*>(e); }

#ifdef MLTRAIN_WITH_NCCL_PG
c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}
void shutdown_nccl_group(const c10::intrusive_ptr<c10d::Backend>& group) {
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(group.get())) nccl->shutdown();
}
#endif

compat::CudaPlugin make_table() {
  compat::CudaPlugin t;
  t.available = available;
  t.device_count = device_count;
  t.set_device = set_device;
  t.synchronize = synchronize;
  t.memory = memory;
  t.total_memory = total_memory;
  t.reset_peak = reset_peak;
  t.device_name = device_name;
  t.cudnn_version = cudnn_version;
  t.rng_state = rng_state;
  t.set_rng_state = set_rng_state;
  t.event_create = event_create;
  t.event_record = event_record;
  t.event_synchronize = event_synchronize;
  t.event_destroy = event_destroy;
#ifdef MLTRAIN_WITH_NCCL_PG
  t.make_nccl_group = make_nccl_group;
  t.shutdown_nccl_group = shutdown_nccl_group;
#else
  t.make_nccl_group = nullptr;
  t.shutdown_nccl_group = nullptr;
#endif
  return t;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const mltrain::compat::CudaPlugin*
mltrain_cuda_plugin() {
  static const mltrain::compat::CudaPlugin table = make_table();
  return &table;
}
