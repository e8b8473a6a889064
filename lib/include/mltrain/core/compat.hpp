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

namespace mltrain::compat {

inline std::string torch_version() { return TORCH_VERSION; }
inline int torch_major() { return TORCH_VERSION_MAJOR; }

inline bool cuda_available() {
#ifdef MLTRAIN_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

inline bool mkldnn_available() { return at::hasMKLDNN(); }

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
    prev_dtype_ = cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
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
