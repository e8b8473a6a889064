#pragma once
// Every LibTorch-version-specific call lives here, so the same sources build against Debian's
// LibTorch 1.13 (CPU, what CI uses) and the LibTorch 2.x + CUDA that users run.
//
//   mltrain::compat::cuda_available();      // false on a CPU-only build
//   auto ver = mltrain::compat::torch_version();
#include <string>
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

}  // namespace mltrain::compat
