#pragma once
// Every LibTorch-version-specific call lives here, so the same sources build against Debian's
// LibTorch 1.13 (CPU, what CI uses) and the LibTorch 2.x + CUDA that users run.
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

// c10d's ProcessGroupGloo and ProcessGroupNCCL derive from ProcessGroup in 1.x and from Backend
// in 2.x (ProcessGroup became a dispatcher over backends); both bases have the same collectives.
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

// c10::Allocator::allocate lost its const and gained a pure virtual copy_data in LibTorch 2.3
// (found by the first CUDA build against pip LibTorch 2.11).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define MLTRAIN_ALLOCATOR_CONST
#define MLTRAIN_ALLOCATOR_HAS_COPY_DATA 1
#else
#define MLTRAIN_ALLOCATOR_CONST const
#define MLTRAIN_ALLOCATOR_HAS_COPY_DATA 0
#endif

inline std::string torch_version() { return TORCH_VERSION; }
inline int torch_major() { return TORCH_VERSION_MAJOR; }

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
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  const auto dev = cuda ? at::kCUDA : at::kCPU;
  return {at::autocast::is_autocast_enabled(dev), at::autocast::get_autocast_dtype(dev)};
#else
  return cuda ? AutocastState{at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()}
              : AutocastState{at::autocast::is_cpu_enabled(),
                              at::autocast::get_autocast_cpu_dtype()};
#endif
}
inline void set_autocast_enabled(bool cuda, bool on) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, on);
#else
  if (cuda)
    at::autocast::set_enabled(on);
  else
    at::autocast::set_cpu_enabled(on);
#endif
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

// Autocast for one region (the forward pass). LibTorch 2.4 replaced the per-device setters with
// set_autocast_enabled(device, on) / set_autocast_dtype(device, dtype).
class AutocastGuard {
 public:
  AutocastGuard(bool enabled, at::ScalarType dtype, bool cuda) : enabled_(enabled), cuda_(cuda) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    const auto dev = cuda ? at::kCUDA : at::kCPU;
    prev_on_ = at::autocast::is_autocast_enabled(dev);
    prev_dtype_ = at::autocast::get_autocast_dtype(dev);
    at::autocast::set_autocast_dtype(dev, dtype);
    at::autocast::set_autocast_enabled(dev, true);
#else
    prev_on_ = cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
    prev_dtype_ =
        cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
    if (cuda) {
      at::autocast::set_autocast_gpu_dtype(dtype);
      at::autocast::set_enabled(true);
    } else {
      at::autocast::set_autocast_cpu_dtype(dtype);
      at::autocast::set_cpu_enabled(true);
    }
#endif
  }
  ~AutocastGuard() {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    const auto dev = cuda_ ? at::kCUDA : at::kCPU;
    at::autocast::set_autocast_enabled(dev, prev_on_);
    at::autocast::set_autocast_dtype(dev, prev_dtype_);
#else
    if (cuda_) {
      at::autocast::set_enabled(prev_on_);
      at::autocast::set_autocast_gpu_dtype(prev_dtype_);
    } else {
      at::autocast::set_cpu_enabled(prev_on_);
      at::autocast::set_autocast_cpu_dtype(prev_dtype_);
    }
#endif
    if (!prev_on_) at::autocast::clear_cache();  // drop the casted-weight cache with the region
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_, cuda_, prev_on_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace mltrain::compat
