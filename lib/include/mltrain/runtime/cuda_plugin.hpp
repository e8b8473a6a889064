#pragma once
// The CUDA half of the engine: libmltrain_cuda.so, built beside the mltrain binary when CUDA is
// compiled in, and dlopen'ed only where an NVIDIA driver is present. The binary itself links
// LibTorch's CPU libraries alone: on a CPU node it never maps libtorch_cuda.so and the CUDA
// libraries it pulls in (~0.14 s of start-up and ~370 MB of resident relocated pages per process,
// measured in docs/PERFORMANCE.md). Loading the plugin runs libtorch_cuda's static initialisers,
// which register the CUDA kernels, hooks, allocators and generators with the LibTorch already in
// the process, so everything that goes through ATen (tensors on kCUDA, pinned memory,
// torch::cuda::is_available) works as if it had been linked.
//
// What ATen does not reach generically (the caching allocator's statistics, device properties,
// events, the CUDA generator, the NCCL process group) is called through this table. It is plain
// function pointers over LibTorch types, so both sides must come from one build (kCudaPluginAbi
// guards against a stale plugin). Nothing here includes a CUDA header.
//
//   if (const auto* cuda = mltrain::compat::cuda_plugin()) cuda->synchronize();
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace mltrain::compat {

inline constexpr int kCudaPluginAbi = 1;

struct CudaMemory {
  int64_t allocated = 0, reserved = 0, peak_allocated = 0;
};

struct CudaPlugin {
  int abi = kCudaPluginAbi;
  bool (*available)();  // a CUDA device is visible
  int (*device_count)();
  void (*set_device)(int index);
  void (*synchronize)();
  CudaMemory (*memory)(int device);
  int64_t (*total_memory)(int device);
  void (*reset_peak)(int device);
  std::string (*device_name)(int device);
  std::string (*cudnn_version)();  // "" when cuDNN cannot be asked
  torch::Tensor (*rng_state)();    // default CUDA generator of device 0
  void (*set_rng_state)(const torch::Tensor& state);
  // An event on the current stream of a device (CopyFence): create, record, wait, free.
  void* (*event_create)();
  void (*event_record)(void* event, int device);
  void (*event_synchronize)(void* event);
  void (*event_destroy)(void* event);
  // NCCL process groups (distributed.backend=nccl); null when the plugin was built without nccl.h.
  c10::intrusive_ptr<c10d::Backend> (*make_nccl_group)(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int size,
                                                       std::chrono::milliseconds timeout);
  // Stops the group's watchdog before its destructor runs (without it the destructor warns and
  // can block at exit).
  void (*shutdown_nccl_group)(const c10::intrusive_ptr<c10d::Backend>& group);
};

// The plugin's one exported symbol.
using CudaPluginEntry = const CudaPlugin* (*)();
inline constexpr const char* kCudaPluginEntry = "mltrain_cuda_plugin";

// Loads the plugin once (thread-safe) and returns its table; null on a CPU-only build, where no
// NVIDIA driver is installed, or when loading failed (cuda_plugin_status() says which). The
// environment variable MLTRAIN_CUDA decides: unset or auto (load where libcuda.so.1, the driver,
// can be opened), on (always load: a machine without a GPU then reports none), off (never).
// mltrain's main() (and mltrain_bench's) calls it before any other LibTorch call, because ATen
// caches its CUDA hooks the first time something asks for them: a program that asks LibTorch
// first (torch::manual_seed does) sees no CUDA even after the plugin loads. The test binaries
// load it lazily, on the first compat:: CUDA query, and run on the CPU.
const CudaPlugin* cuda_plugin();
// One line for --version and env.json: "loaded (path)", "not loaded: <why>" or "not built".
std::string cuda_plugin_status();
// Whether libtorch_cuda.so is in this process at all (the loader's answer, not the plugin's).
bool cuda_libraries_mapped();

}  // namespace mltrain::compat
