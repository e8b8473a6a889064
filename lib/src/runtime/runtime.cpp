#include "mltrain/runtime/runtime.hpp"

#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <mutex>

#include <ATen/Version.h>
#include <torch/torch.h>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"

namespace mltrain::runtime {
namespace {
std::string g_allocator = "system";
int g_threads = 1;
}  // namespace

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

void set_allocator_policy(const std::string& policy) {
  if (policy == "retain") {
    // glibc serves blocks above M_MMAP_THRESHOLD with mmap and unmaps them on free, and trims the
    // heap top above M_TRIM_THRESHOLD: a training step's activations (100 KiB..10 MiB) are then
    // faulted in afresh every step. Fixing both thresholds keeps freed blocks for reuse; the
    // peak RSS stays bounded by the step's own peak because the same sizes recur every step.
    mallopt(M_MMAP_THRESHOLD, 512 << 20);
    mallopt(M_TRIM_THRESHOLD, 1024 << 20);
    mallopt(M_TOP_PAD, 16 << 20);
  } else if (policy != "system") {
    throw ConfigError("runtime.allocator", "unknown allocator policy '" + policy + "'",
                      "use retain or system");
  }
  g_allocator = policy;
}

void apply(const RuntimeOptions& opt) {
  set_allocator_policy(opt.allocator);
  g_threads = opt.threads > 0 ? opt.threads : usable_cores();
  at::set_num_threads(g_threads);
  set_kernel_route(opt.kernel_route);
}

int64_t minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}
int64_t peak_rss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}
int64_t current_rss_kib() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

double seconds_since_exec() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return NAN;
  std::istringstream fields(stat.substr(close + 1));  // from field 3 (the state) on
  std::string f;
  for (int i = 3; i <= 22; ++i)  // field 22: the start time, in clock ticks since boot
    if (!(fields >> f)) return NAN;
  timespec now{};
  if (::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return NAN;
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec) -
         std::stod(f) / double(sysconf(_SC_CLK_TCK));
}

static std::string cpu_flags_of_interest() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      for (const char* f :
           {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"})
        if (line.find(std::string(" ") + f) != std::string::npos)
          out += std::string(out.empty() ? "" : " ") + f;
      break;
    }
  }
  return out;
}

bool cpu_has_native_bf16() {
  const std::string f = " " + cpu_flags_of_interest() + " ";
  return f.find(" avx512_bf16 ") != std::string::npos || f.find(" amx_bf16 ") != std::string::npos;
}

nlohmann::json kernels() {
  // "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build ..." -> "MKL 2024.2"
  std::string blas = at::hasMKL() ? at::get_mkl_version() : "LibTorch's own (no MKL)";
  if (const auto pos = blas.find("Version "); at::hasMKL() && pos != std::string::npos)
    blas = "MKL " + blas.substr(pos + 8, blas.find_first_of("- ", pos + 8) - (pos + 8));
  std::string dnnl = at::hasMKLDNN() ? at::get_mkldnn_version() : "none";
  if (const auto v = dnnl.find(" v"); v != std::string::npos)
    dnnl = dnnl.substr(v + 1, dnnl.find(' ', v + 1) - (v + 1));
  return {{"blas", blas},
          {"onednn", dnnl},
          {"cpu_capability", at::get_cpu_capability()},
          {"bf16", cpu_has_native_bf16()}};
}

std::string libtorch_path() {
  void* h = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return "";
  std::string path;
  link_map* map = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) path = map->l_name;
  dlclose(h);  // drops only the reference NOLOAD took
  std::error_code ec;
  const auto canonical = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : canonical.string();
}

nlohmann::json describe() {
  return {{"threads", at::get_num_threads()},
          {"usable_cores", usable_cores()},
          {"kernels", kernels()},
          {"kernel_route", kernel_route()},
          {"allocator", g_allocator},
          {"libtorch", compat::torch_version()},
          {"libtorch_path", libtorch_path()},
          {"mkldnn", compat::mkldnn_available()},
          {"cuda_built", compat::cuda_built()},
          {"cuda_libraries", compat::cuda_plugin_status()},
          {"cuda_libraries_mapped", compat::cuda_libraries_mapped()},
          {"cuda", compat::cuda_available()},
          {"cuda_device", compat::cuda_device_name()},
          {"cudnn_benchmark", compat::cuda_available() && compat::cudnn_benchmark()},
          {"cpu_flags", cpu_flags_of_interest()}};
}

}  // namespace mltrain::runtime
