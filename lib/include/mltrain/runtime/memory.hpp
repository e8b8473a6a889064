#pragma once
// Tensor memory as the allocator sees it, on the CPU as on CUDA: what is live now and the peak
// since the last reset. On CUDA these are the caching allocator's own statistics
// (max_memory_allocated); on the CPU LibTorch keeps none, so `track_cpu()` installs a counting
// allocator in place of its CPU allocator (two relaxed atomic adds per allocation). Tensors allocated before
// it was installed are not counted. Blocks come from c10::alloc_cpu, as LibTorch's own. The same wrapper can refuse allocations past a limit with
// c10::OutOfMemoryError, as CUDA's allocator does at capacity: that is how `runtime.memory_budget`
// is enforced on the CPU, so the out-of-memory recovery path runs for real in the tests.
//
//   memory::track_cpu();
//   memory::reset_peak(device);
//   step();
//   spdlog::info("step peak {} MiB", memory::stats(device).peak >> 20);
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace mltrain::memory {

struct Stats {
  int64_t live = 0, peak = 0;  // bytes
};

void track_cpu();  // idempotent
Stats stats(const torch::Device& device);
void reset_peak(const torch::Device& device);  // peak := live

// CPU allocations that would take live tensor memory above `bytes` throw c10::OutOfMemoryError
// (0: no limit). Needs track_cpu().
void set_cpu_limit(int64_t bytes);

// An out-of-memory error from either allocator.
bool is_out_of_memory(const std::exception& e);

std::string mib(int64_t bytes);  // "123.4 MiB"

}  // namespace mltrain::memory
