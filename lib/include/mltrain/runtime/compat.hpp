#pragma once
// LibTorch's CUDA and version-specific calls live here. The CUDA half is a plugin
// (runtime/cuda_plugin.hpp: libmltrain_cuda.so, loaded only where an NVIDIA driver is), so the
// mltrain binary links LibTorch's CPU libraries alone and the same sources serve the CPU-only
// build (no nvcc: cuda_built() is false and no plugin exists). mltrain builds against LibTorch
// 2.15 from PyPI only (docs/ARCHITECTURE.md, "Engine version").
//
//   mltrain::compat::cuda_available();      // false on a CPU-only build or a CPU node
//   auto ver = mltrain::compat::torch_version();
#include <string>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "mltrain/runtime/cuda_plugin.hpp"

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
  const auto* cuda = cuda_plugin();
  return cuda && cuda->available();
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
  const auto* cuda = cuda_plugin();
  return cuda ? cuda->device_count() : 0;
}

// Makes `index` the current CUDA device (NCCL and the caching allocator follow it).
inline void set_cuda_device(int index) {
  if (const auto* cuda = cuda_plugin()) cuda->set_device(index);
}

inline void set_cudnn_benchmark(bool on) { at::globalContext().setBenchmarkCuDNN(on); }
inline bool cudnn_benchmark() { return at::globalContext().benchmarkCuDNN(); }

// Page-locked host memory needs a CUDA runtime (the plugin's libraries registered its allocator);
// without one a plain allocation is returned.
inline torch::Tensor host_empty(at::IntArrayRef shape, at::ScalarType dtype, bool pinned) {
  auto o = torch::TensorOptions().dtype(dtype);
  return torch::empty(shape, cuda_available() && pinned ? o.pinned_memory(true) : o);
}

inline void cuda_synchronize() {
  if (const auto* cuda = cuda_plugin()) cuda->synchronize();
}

// Marks the point in the current CUDA stream after an asynchronous host-to-device copy; wait()
// blocks until the copy has read its (pinned) source, so the loader may refill that buffer.
// A no-op without CUDA and for CPU batches.
class CopyFence {
 public:
  CopyFence() = default;
  CopyFence(const CopyFence&) = delete;
  CopyFence& operator=(const CopyFence&) = delete;
  CopyFence(CopyFence&& o) noexcept : event_(o.event_), armed_(o.armed_) {
    o.event_ = nullptr;
    o.armed_ = false;
  }
  CopyFence& operator=(CopyFence&& o) noexcept {
    std::swap(event_, o.event_);
    std::swap(armed_, o.armed_);
    return *this;
  }
  ~CopyFence() {
    if (event_) cuda_plugin()->event_destroy(event_);
  }
  void record(const torch::Device& dev) {
    if (!dev.is_cuda()) return;
    const auto* cuda = cuda_plugin();
    if (!cuda) return;
    if (!event_) event_ = cuda->event_create();
    cuda->event_record(event_, dev.index() < 0 ? 0 : dev.index());
    armed_ = true;
  }
  void wait() {
    if (armed_) cuda_plugin()->event_synchronize(event_);
    armed_ = false;
  }

 private:
  void* event_ = nullptr;
  bool armed_ = false;
};

inline CudaMemory cuda_memory(int device = 0) {
  const auto* cuda = cuda_plugin();
  return cuda ? cuda->memory(device) : CudaMemory{};
}
// Total memory of a GPU (bytes; 0 without CUDA): the default budget for data.batch_size=auto.
inline int64_t cuda_total_memory(int device = 0) {
  const auto* cuda = cuda_plugin();
  return cuda ? cuda->total_memory(device) : 0;
}
inline void cuda_reset_peak(int device = 0) {
  if (const auto* cuda = cuda_plugin()) cuda->reset_peak(device);
}

// Versions for `mltrain checklist` and env.json: CUDA the LibTorch was built with, cuDNN it
// loaded; empty strings on CPU builds.
struct CudaVersions {
  std::string cuda, cudnn;
};
inline CudaVersions cuda_versions() {
  CudaVersions v;
#ifdef MLTRAIN_TORCH_CUDA_VERSION
  v.cuda = MLTRAIN_TORCH_CUDA_VERSION;
#endif
  if (const auto* cuda = cuda_plugin()) v.cudnn = cuda->cudnn_version();
  return v;
}

inline std::string cuda_device_name(int device = 0) {
  const auto* cuda = cuda_plugin();
  return cuda ? cuda->device_name(device) : "";
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

// The next 64 bits of the default CPU generator (its mt19937): one draw, as the state's owner sees
// it, so a saved and restored state (checkpoints, replays) gives the same value again.
inline uint64_t cpu_rng_next64() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

// RNG state of the default CUDA generator (dropout on the GPU); empty without CUDA.
inline torch::Tensor cuda_rng_state() {
  const auto* cuda = cuda_plugin();
  return cuda ? cuda->rng_state() : torch::Tensor();
}
inline void set_cuda_rng_state(const torch::Tensor& state) {
  if (const auto* cuda = cuda_plugin()) cuda->set_rng_state(state);
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
