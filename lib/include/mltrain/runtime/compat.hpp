#pragma once
// LibTorch's CUDA and version-specific calls live here, behind MLTRAIN_WITH_CUDA, so the CPU-only
// binary (no nvcc) compiles the same sources as the CUDA one. mltrain builds against LibTorch 2.15
// from PyPI only: the shims for Debian's 1.13 (pre-2.3 allocator, pre-2.4 autocast setters,
// c10d's ProcessGroup base) are gone (docs/ARCHITECTURE.md, "Engine version").
//
//   mltrain::compat::cuda_available();      // false on a CPU-only build
//   auto ver = mltrain::compat::torch_version();
#include <string>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>
#ifdef MLTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace mltrain::compat {

// The c10d backend a data-parallel group holds: ProcessGroupGloo and ProcessGroupNCCL derive from
// Backend (ProcessGroup is a dispatcher over backends).
using C10dGroup = c10d::Backend;

inline std::string torch_version() { return TORCH_VERSION; }

inline constexpr bool cuda_built() {
#ifdef MLTRAIN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

inline bool cuda_available() {
#ifdef MLTRAIN_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

inline bool mkldnn_available() { return at::hasMKLDNN(); }

// The device a run trains on: "auto" picks CUDA when this build and machine have it; `index` is
// the GPU (a data-parallel rank's LOCAL_RANK).
inline torch::Device resolve_device(const std::string& name, int index = 0) {
  if (name == "cpu") return torch::kCPU;
  if (name == "cuda" || (name == "auto" && cuda_available()))
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  return torch::kCPU;
}

inline int cuda_device_count() {
#ifdef MLTRAIN_WITH_CUDA
  return cuda_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
#else
  return 0;
#endif
}

// Makes `index` the current CUDA device (NCCL and the caching allocator follow it).
inline void set_cuda_device(int index) {
#ifdef MLTRAIN_WITH_CUDA
  if (cuda_available()) c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#else
  (void)index;
#endif
}

inline void set_cudnn_benchmark(bool on) { at::globalContext().setBenchmarkCuDNN(on); }
inline bool cudnn_benchmark() { return at::globalContext().benchmarkCuDNN(); }

// Page-locked host memory needs a CUDA runtime; on a CPU build a plain allocation is returned.
inline torch::Tensor host_empty(at::IntArrayRef shape, at::ScalarType dtype, bool pinned) {
  auto o = torch::TensorOptions().dtype(dtype);
  return torch::empty(shape, cuda_available() && pinned ? o.pinned_memory(true) : o);
}

inline void cuda_synchronize() {
#ifdef MLTRAIN_WITH_CUDA
  if (cuda_available()) torch::cuda::synchronize();
#endif
}

// Marks the point in the current CUDA stream after an asynchronous host-to-device copy; wait()
// blocks until the copy has read its (pinned) source, so the loader may refill that buffer.
// A no-op on CPU builds and for CPU batches.
class CopyFence {
 public:
  void record(const torch::Device& dev) {
#ifdef MLTRAIN_WITH_CUDA
    if (dev.is_cuda()) {
      event_.record(at::cuda::getCurrentCUDAStream(dev.index()));
      armed_ = true;
    }
#endif
  }
  void wait() {
#ifdef MLTRAIN_WITH_CUDA
    if (armed_) event_.synchronize();
    armed_ = false;
#endif
  }

 private:
#ifdef MLTRAIN_WITH_CUDA
  at::cuda::CUDAEvent event_;
  bool armed_ = false;
#endif
};

struct CudaMemory {
  int64_t allocated = 0, reserved = 0, peak_allocated = 0;
};
inline CudaMemory cuda_memory(int device = 0) {
  CudaMemory m;
#ifdef MLTRAIN_WITH_CUDA
  if (!cuda_available()) return m;
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const size_t agg = 0;  // StatType::AGGREGATE in every version (the enum moved namespaces in 2.5)
  m.allocated = s.allocated_bytes[agg].current;
  m.reserved = s.reserved_bytes[agg].current;
  m.peak_allocated = s.allocated_bytes[agg].peak;
#endif
  return m;
}
// Total memory of a GPU (bytes; 0 on CPU builds): the default budget for data.batch_size=auto.
inline int64_t cuda_total_memory(int device = 0) {
#ifdef MLTRAIN_WITH_CUDA
  if (cuda_available())
    return static_cast<int64_t>(at::cuda::getDeviceProperties(device)->totalGlobalMem);
#endif
  (void)device;
  return 0;
}
inline void cuda_reset_peak(int device = 0) {
#ifdef MLTRAIN_WITH_CUDA
  if (cuda_available()) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#endif
  (void)device;
}

// Versions for `mltrain checklist` and env.json: CUDA the LibTorch was built with, cuDNN it
// loaded; empty strings on CPU builds.
struct CudaVersions {
  std::string cuda, cudnn;
};
inline CudaVersions cuda_versions() {
  CudaVersions v;
#ifdef MLTRAIN_WITH_CUDA
#ifdef CUDA_VERSION
  v.cuda = std::to_string(CUDA_VERSION / 1000) + "." + std::to_string((CUDA_VERSION % 1000) / 10);
#endif
  try {
    if (cuda_available()) v.cudnn = std::to_string(at::detail::getCUDAHooks().versionCuDNN());
  } catch (const std::exception&) {
  }
#endif
  return v;
}

inline std::string cuda_device_name(int device = 0) {
#ifdef MLTRAIN_WITH_CUDA
  if (cuda_available()) return at::cuda::getDeviceProperties(device)->name;
#endif
  return "";
}

// RNG state of the default CPU generator, as a uint8 tensor (the same bytes torch.get_rng_state()
// returns in Python).
inline torch::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
inline void set_cpu_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// RNG state of the default CUDA generator (dropout on the GPU); empty on CPU builds.
inline torch::Tensor cuda_rng_state() {
#ifdef MLTRAIN_WITH_CUDA
  if (cuda_available()) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(0);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
#endif
  return {};
}
inline void set_cuda_rng_state(const torch::Tensor& state) {
#ifdef MLTRAIN_WITH_CUDA
  if (cuda_available() && state.defined()) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(0);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
#endif
}

// Whether autocast is on for the CPU or CUDA, and its dtype: what activation checkpointing records
// at forward time so the recomputation in backward (possibly on another thread) runs the same casts.
struct AutocastState {
  bool on = false;
  at::ScalarType dtype = at::kBFloat16;
};
inline AutocastState autocast_state(bool cuda) {
  const auto dev = cuda ? at::kCUDA : at::kCPU;
  return {at::autocast::is_autocast_enabled(dev), at::autocast::get_autocast_dtype(dev)};
}
inline void set_autocast_enabled(bool cuda, bool on) {
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, on);
}

// Autocast off for one region on both devices (amp.fp32_modules: a module that must run in fp32).
class AutocastOff {
 public:
  AutocastOff() : cpu_(autocast_state(false).on), cuda_(autocast_state(true).on) {
    if (cpu_) set_autocast_enabled(false, false);
    if (cuda_) set_autocast_enabled(true, false);
  }
  ~AutocastOff() {
    if (cpu_) set_autocast_enabled(false, true);
    if (cuda_) set_autocast_enabled(true, true);
  }
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  bool cpu_, cuda_;
};

// Autocast for one region (the forward pass), on the CPU or CUDA.
class AutocastGuard {
 public:
  AutocastGuard(bool enabled, at::ScalarType dtype, bool cuda) : enabled_(enabled), cuda_(cuda) {
    if (!enabled_) return;
    const auto dev = cuda ? at::kCUDA : at::kCPU;
    prev_on_ = at::autocast::is_autocast_enabled(dev);
    prev_dtype_ = at::autocast::get_autocast_dtype(dev);
    at::autocast::set_autocast_dtype(dev, dtype);
    at::autocast::set_autocast_enabled(dev, true);
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    const auto dev = cuda_ ? at::kCUDA : at::kCPU;
    at::autocast::set_autocast_enabled(dev, prev_on_);
    at::autocast::set_autocast_dtype(dev, prev_dtype_);
    if (!prev_on_) at::autocast::clear_cache();  // drop the casted-weight cache with the region
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_, cuda_, prev_on_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace mltrain::compat
