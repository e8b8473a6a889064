#pragma once
// Process-wide runtime set-up, done once at start-up: intra-op threads, the allocator policy and
// the kernel route that backs fp32 Linear/matmul. These decide CPU speed more than anything else
// measured here (README "Why it is fast"), so they live in one place and are reported in env.json.
//
//   mltrain::runtime::RuntimeOptions opt;          // defaults are the fast route
//   mltrain::runtime::apply(opt);
//   spdlog::info("{}", mltrain::runtime::describe().dump());
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mltrain::runtime {

struct RuntimeOptions {
  int threads = 0;                      // intra-op threads; 0 = every core this process may use
  std::string kernel_route = "onednn";  // onednn | native
  std::string allocator = "retain";     // retain | system
};

// Applies all three; idempotent. Throws ConfigError on unknown names.
void apply(const RuntimeOptions& opt);

// fp32 mm/addmm on CPU go to oneDNN's sgemm ("onednn") or stay on LibTorch's own kernel, which in
// Debian's build calls the reference BLAS ("native"). Returns the route now in force.
void set_kernel_route(const std::string& route);
std::string kernel_route();

// "retain": glibc keeps freed memory instead of unmapping it after every step (mallopt), so
// the training loop stops page-faulting; "system": glibc's defaults.
void set_allocator_policy(const std::string& policy);

int usable_cores();         // sched_getaffinity count
nlohmann::json describe();  // threads, route, allocator, versions, CPU flags

// Minor page faults of this process so far (getrusage), and peak RSS in KiB.
int64_t minor_faults();
int64_t peak_rss_kib();
// Resident set now (VmRSS: anonymous + file-backed mapped pages), KiB; 0 where /proc is absent.
int64_t current_rss_kib();

}  // namespace mltrain::runtime
