#pragma once
// Process-wide runtime set-up, done once at start-up: intra-op threads, the allocator policy and
// the kernel route that backs fp32 Linear/matmul. These decide CPU speed more than anything else
// measured here, so they live in one place and are reported, with the kernels LibTorch runs (BLAS,
// oneDNN, CPU capability), in env.json.
//
//   mltrain::runtime::RuntimeOptions opt;          // defaults are the fast route
//   mltrain::runtime::apply(opt);
//   spdlog::info("{}", mltrain::runtime::describe().dump());
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace mltrain::runtime {

struct RuntimeOptions {
  int threads = 0;                      // intra-op threads; 0 = every core this process may use
  std::string allocator = "retain";     // retain | system
  std::string kernel_route = "onednn";  // onednn | native
};

// Applies all three; idempotent. Throws ConfigError on unknown names.
void apply(const RuntimeOptions& opt);

// fp32 mm/addmm/bmm on CPU go to oneDNN's sgemm ("onednn": Debian's libdnnl.so.2, loaded on first
// use) or stay on LibTorch's own kernel, MKL in the wheel ("native"). Where libdnnl cannot be
// loaded, "onednn" stays native and says so once. Returns the route in force ("onednn"/"native").
void set_kernel_route(const std::string& route);
std::string kernel_route();

// The CPU kernels this LibTorch runs: {"blas": "MKL 2024.2", "onednn": "v3.13.3",
// "cpu_capability": "AVX512", "bf16": true}. bf16 is true where the CPU has native bf16 dot
// products (AVX512-BF16 or AMX), the only CPUs on which bf16 autocast trains faster than fp32.
nlohmann::json kernels();
bool cpu_has_native_bf16();
// The file of the libtorch_cpu.so this process runs (the loader's answer: the venv's or the
// wheel user's torch/lib), for --version and env.json; "" when none is mapped.
std::string libtorch_path();

// "retain": glibc keeps freed memory instead of unmapping it after every step (mallopt), so
// the training loop stops page-faulting; "system": glibc's defaults.
void set_allocator_policy(const std::string& policy);

int usable_cores();         // sched_getaffinity count
nlohmann::json describe();  // threads, allocator, kernels, versions, CPU flags

// Minor page faults of this process so far (getrusage), and peak RSS in KiB.
int64_t minor_faults();
int64_t peak_rss_kib();
// Resident set now (VmRSS: anonymous + file-backed mapped pages), KiB; 0 where /proc is absent.
int64_t current_rss_kib();
// Seconds since this process was exec'd (/proc/self/stat's start time against CLOCK_BOOTTIME, to
// the kernel's 10 ms tick): dynamic loading and static initialisers included. NaN without /proc.
double seconds_since_exec();

// f(b, e) over [begin, end) in chunks of at least `grain`, on LibTorch's intra-op threads, as
// at::parallel_for. ATen's is inline and runs serially in a file compiled without OpenMP, which is
// every file of mltrain: call this one (runtime/parallel.cpp calls LibTorch's libgomp directly).
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& f);

}  // namespace mltrain::runtime
