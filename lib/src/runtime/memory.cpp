#include "mltrain/runtime/memory.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "mltrain/runtime/compat.hpp"

namespace mltrain::memory {
namespace {

std::atomic<int64_t> g_live{0}, g_peak{0}, g_limit{0};

void add(int64_t n) {
  const int64_t now = g_live.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// Each block carries its size in a 64-byte header in front of the data (which stays 64-byte
// aligned), so the data pointer is also the deleter's context: LibTorch's raw_allocate (used by
// some CPU kernels for workspaces) requires exactly that of a CPU allocator.
constexpr size_t kHeader = 64;

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t limit = g_limit.load(std::memory_order_relaxed);
    if (limit > 0 && g_live.load(std::memory_order_relaxed) + bytes > limit)
      TORCH_CHECK_WITH(OutOfMemoryError, false,
                       "mltrain: tensor memory budget exceeded: ", mib(g_live.load()), " live + ",
                       mib(bytes), " requested > budget ", mib(limit));
    auto* raw = static_cast<uint8_t*>(c10::alloc_cpu(n + kHeader));
    *reinterpret_cast<int64_t*>(raw) = bytes;
    void* data = raw + kHeader;
    add(bytes);
    return {data, data, &CountingAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  static void release(void* data) {
    if (!data) return;
    auto* raw = static_cast<uint8_t*>(data) - kHeader;
    g_live.fetch_sub(*reinterpret_cast<int64_t*>(raw), std::memory_order_relaxed);
    c10::free_cpu(raw);
  }
};

std::once_flag g_once;

}  // namespace

void track_cpu() {
  std::call_once(g_once, [] {
    static CountingAllocator counting;
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  });
}

Stats stats(const torch::Device& device) {
  if (device.is_cuda()) {
    const auto m = compat::cuda_memory(device.index() < 0 ? 0 : device.index());
    return {m.allocated, m.peak_allocated};
  }
  return {g_live.load(), g_peak.load()};
}

void reset_peak(const torch::Device& device) {
  if (device.is_cuda()) {
    compat::cuda_reset_peak(device.index() < 0 ? 0 : device.index());
    return;
  }
  g_peak = g_live.load();
}

void set_cpu_limit(int64_t bytes) { g_limit = bytes; }

bool is_out_of_memory(const std::exception& e) {
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace mltrain::memory
