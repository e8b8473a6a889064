#include "mltrain/checklist/checklist.hpp"
#include "mltrain/core/clock.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "mltrain/config/format.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/dist/nccl_check.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/profile/op_profiler.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::checklist {
using config::format_fixed;
using profile::OpProfiler;
namespace {

using Clock = std::chrono::steady_clock;

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

using Item = ChecklistItem;
using Report = ChecklistReport;

// Files behind the config's data set.
std::vector<std::string> data_files(const config::DataConfig& d) {
  if (d.dataset == "fashion_mnist") {
    const fs::path r = d.root;
    return {(r / "train-images-idx3-ubyte.gz").string(),
            (r / "train-labels-idx1-ubyte.gz").string(), (r / "t10k-images-idx3-ubyte.gz").string(),
            (r / "t10k-labels-idx1-ubyte.gz").string()};
  }
  std::vector<std::string> out;
  for (const auto& f : {d.train_images, d.train_labels, d.test_images, d.test_labels})
    if (!f.empty()) out.push_back(f);
  return out;
}

// Reads every file once with 1 MiB reads; cold first asks the kernel to drop its cached pages.
double read_mb_per_s(const std::vector<std::string>& files, bool cold, double* bytes_out) {
  std::vector<char> buf(1 << 20);
  double bytes = 0;
  const auto t0 = Clock::now();
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    if (cold) {
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    ssize_t n;
    while ((n = ::read(fd, buf.data(), buf.size())) > 0) bytes += static_cast<double>(n);
    ::close(fd);
  }
  *bytes_out = bytes;
  return bytes / 1e6 / std::max(1e-9, seconds_since(t0));
}

int64_t checkpoint_bytes(const config::ExperimentConfig& cfg, model::Model& m) {
  int64_t params = 0;
  for (auto& [n, p] : m.named_parameters()) params += p.numel() * p.element_size();
  int64_t buffers = 0;
  for (auto& [n, b] : m.named_buffers()) buffers += b.numel() * b.element_size();
  const auto& o = cfg.optim;
  const double opt_copies = (o.name == "adam" || o.name == "adamw") ? 2 : (o.momentum > 0 ? 1 : 0);
  return static_cast<int64_t>(params * (1 + opt_copies + (cfg.ema.enabled ? 1 : 0)) + buffers);
}

// Conv weights followed by a BatchNorm of the same width: what `mltrain fuse` would fold.
int count_conv_bn_pairs(model::Model& m) {
  std::set<std::string> bn;
  for (auto& [n, b] : m.named_buffers())
    if (n.size() > 13 && n.compare(n.size() - 13, 13, ".running_mean") == 0)
      bn.insert(n.substr(0, n.size() - 13));
  int pairs = 0;
  for (auto& [n, p] : m.named_parameters()) {
    if (p.dim() != 4 || n.size() < 7 || n.compare(n.size() - 7, 7, ".weight") != 0) continue;
    const std::string mod = n.substr(0, n.size() - 7);
    const auto dot = mod.rfind('.');
    const std::string prefix = dot == std::string::npos ? "" : mod.substr(0, dot + 1);
    const std::string leaf = dot == std::string::npos ? mod : mod.substr(dot + 1);
    std::vector<std::string> cands = {prefix + leaf + "_bn"};
    if (leaf.rfind("conv", 0) == 0) cands.push_back(prefix + "bn" + leaf.substr(4));
    for (const auto& c : cands)
      if (bn.count(c)) {
        ++pairs;
        break;
      }
  }
  return pairs;
}

}  // namespace

nlohmann::json judge_gemm(double g) {
  const std::string exp = ">= 80 GFLOP/s fp32 (reference BLAS gives ~5)";
  if (g < 20) return {{"status", "FAIL"}, {"expected", exp}};
  if (g < 80) return {{"status", "WARN"}, {"expected", exp}};
  return {{"status", "PASS"}, {"expected", exp}};
}
nlohmann::json judge_threads(int threads, int cores) {
  const std::string exp =
      "intra-op threads between cores/2 and cores (" + std::to_string(cores) + ")";
  if (threads > cores) return {{"status", "FAIL"}, {"expected", exp}};
  if (threads * 2 < cores) return {{"status", "WARN"}, {"expected", exp}};
  return {{"status", "PASS"}, {"expected", exp}};
}
nlohmann::json judge_disk(double free_b, double need_b) {
  const std::string exp =
      ">= 2x the bytes the kept checkpoints need (" + format_fixed(need_b / 1e6) + " MB)";
  if (free_b < need_b) return {{"status", "FAIL"}, {"expected", exp}};
  if (free_b < 2 * need_b) return {{"status", "WARN"}, {"expected", exp}};
  return {{"status", "PASS"}, {"expected", exp}};
}
nlohmann::json judge_swappiness(int v) {
  return {{"status", v <= 10 ? "PASS" : "WARN"}, {"expected", "<= 10"}};
}

namespace {

// What every check reads: the options, the config (or the defaults), the device and, with a
// config, its splits and model from the pipeline seam.
struct Context {
  const ChecklistOptions& o;
  const config::ExperimentConfig& cfg;
  bool full = false, cuda = false;
  torch::Device device = torch::kCPU;
  const train::Splits* splits = nullptr;
  model::Model* model = nullptr;
  std::string no_cfg, no_cuda;
};

// Real training steps of the config's model (defaults: the CNN) on a random batch: page faults per
// step under runtime.allocator. Measured first, before the other checks' allocations move glibc's
// dynamic thresholds.
Item allocator_check(const Context& c) {
  {
    const auto shape0 = c.o.cfg ? c.splits->train.sample_shape : std::vector<int64_t>{1, 28, 28};
    auto m = model::build_model(c.cfg.model, shape0, c.cfg.data.num_classes, c.cfg.run.seed);
    m->to(c.device);
    auto opt = optim::Optimizer::create(c.cfg.optim, m->named_parameters());
    auto shape = shape0;
    shape.insert(shape.begin(), c.cfg.data.batch_size);
    auto x = torch::randn(shape).to(c.device);
    auto y =
        torch::randint(c.cfg.data.num_classes, {c.cfg.data.batch_size}, torch::kLong).to(c.device);
    auto step = [&] {
      auto loss = torch::nn::functional::cross_entropy(m->forward(x), y);
      loss.backward();
      opt->step(1e-4);
      opt->zero_grad();
    };
    for (int i = 0; i < 3; ++i) step();
    const int64_t f0 = runtime::minor_faults();
    const int iters = c.full ? 30 : 10;
    for (int i = 0; i < iters; ++i) step();
    const double per = static_cast<double>(runtime::minor_faults() - f0) / iters;
    const std::string pol = c.cfg.runtime.allocator;
    return Item{
        "system.allocator",
        "system",
        per > 1000 ? "WARN" : "PASS",
        format_fixed(per, 0) + " page faults per training step (" + m->describe() + ", batch " +
            std::to_string(c.cfg.data.batch_size) + ") with runtime.allocator=" + pol,
        "< 1000 per step",
        "glibc hands large blocks back to the kernel; re-faulting them cost 4.6x on the CNN here",
        per > 1000 ? "runtime.allocator=retain" : "",
        {{"faults_per_step", per}}};
  }
}

// Cold and cached read rate of the data set's files; returns the cold rate (0 without a config).
double read_bandwidth_check(const Context& c, Report& rep) {
  double cold_mbs = 0;
  if (!c.o.cfg) {
    rep.skip("data.read_bandwidth", "data", c.no_cfg,
             "loading cannot outrun the disk the data set lives on");
  } else {
    double bytes = 0;
    const auto files = data_files(c.cfg.data);
    cold_mbs = read_mb_per_s(files, true, &bytes);
    const double warm = read_mb_per_s(files, false, &bytes);
    Item it{
        "data.read_bandwidth",
        "data",
        warm >= 500 ? "PASS" : "WARN",
        "cold " + format_fixed(cold_mbs) + " MB/s, cached " + format_fixed(warm) + " MB/s over " +
            format_fixed(bytes / 1e6) + " MB",
        ">= 500 MB/s cached",
        "a training epoch re-reads the data set; a slow disk shows up as data wait",
        warm >= 500
            ? ""
            : "keep the data set on local SSD or in page cache (data convert to .shard, then mmap)",
        {{"cold_mb_s", cold_mbs}, {"cached_mb_s", warm}, {"bytes", bytes}}};
    it.measured += " (cold = after posix_fadvise DONTNEED; the kernel may keep some pages)";
    rep.add(it);
  }
  return cold_mbs;
}

// The loader's supply rate against the disk, and what augmentation costs the loader threads.
void loader_checks(const Context& c, Report& rep, double cold_mbs) {
  if (!c.o.cfg) {
    rep.skip("data.loader_rate", "data", c.no_cfg,
             "the loader must supply samples faster than the model consumes them");
    rep.skip("data.augmentation_cost", "data", c.no_cfg,
             "per-sample augmentation runs on the loader threads");
  } else {
    data::LoaderOptions lo = train::train_loader_options(c.cfg, c.device, &c.splits->train);
    const auto loader = train::augmented_loader(c.cfg, c.splits->train, lo);
    data::Loader& l = *loader;
    const bool augmenting = l.augmenter() != nullptr;
    l.start_epoch(0);
    const int64_t batches = std::min<int64_t>(l.batches_per_epoch(), c.full ? 300 : 40);
    data::Batch b;
    const auto t0 = Clock::now();
    int64_t samples = 0;
    for (int64_t i = 0; i < batches && l.next(b); ++i) samples += b.y.size(0);
    const double secs = seconds_since(t0);
    const double rate = samples / std::max(1e-9, secs);
    const double mb_s = rate * static_cast<double>(c.splits->train.sample_bytes()) / 1e6;
    const bool disk_limited = cold_mbs > 0 && mb_s > 0.8 * cold_mbs &&
                              c.splits->train.source.find(".gz") == std::string::npos;
    rep.add({"data.loader_rate",
             "data",
             disk_limited ? "WARN" : "PASS",
             format_fixed(rate, 0) + " samples/s = " + format_fixed(mb_s) +
                 " MB/s of samples with " + std::to_string(lo.workers) + " worker(s); cold disk " +
                 format_fixed(cold_mbs) + " MB/s",
             "below the disk's rate (not disk-bound)",
             "a loader at the disk limit cannot be helped by more workers",
             disk_limited ? "cache the data set in RAM or on faster storage" : "",
             {{"samples_per_s", rate}, {"mb_per_s", mb_s}, {"workers", lo.workers}}});
    if (!augmenting) {
      rep.skip("data.augmentation_cost", "data", "this config has no augmentation enabled",
               "per-sample augmentation runs on the loader threads");
    } else {
      const double per_sample_us =
          l.augmented_samples() > 0 ? l.augment_seconds() / l.augmented_samples() * 1e6 : 0;
      const double fill_us =
          l.filled_samples() > 0 ? l.fill_cpu_seconds() / l.filled_samples() * 1e6 : 0;
      const double share = fill_us > 0 ? per_sample_us / fill_us : 0;
      rep.add({"data.augmentation_cost",
               "data",
               share > 0.5 ? "WARN" : "PASS",
               format_fixed(per_sample_us, 2) + " us/sample, " + format_fixed(100 * share) +
                   "% of the loader's CPU per sample",
               "<= 50% of the loader's per-sample time",
               "costly augmentation starves the model of batches",
               share > 0.5 ? "add data.workers, lower p, or narrow the costly ops' window" : "",
               {{"us_per_sample", per_sample_us}, {"share_of_loader", share}}});
    }
  }
}

void pinned_copy_check(const Context& c, Report& rep) {
  if (!c.cuda) {
    rep.skip("data.pinned_copy", "data", c.no_cuda,
             "pinned host memory doubles host-to-device copy bandwidth");
  } else {
    const int64_t n = (c.full ? 256 : 64) << 18;  // floats: 64 MiB quick, 256 MiB full
    auto rate = [&](bool pinned) {
      auto h = compat::host_empty({n}, torch::kFloat32, pinned).fill_(1);
      auto d = torch::empty({n}, torch::dtype(torch::kFloat32).device(c.device));
      d.copy_(h, pinned);
      compat::cuda_synchronize();
      const auto t0 = Clock::now();
      for (int i = 0; i < 5; ++i) d.copy_(h, pinned);
      compat::cuda_synchronize();
      return 5.0 * n * 4 / 1e9 / seconds_since(t0);
    };
    const double pageable = rate(false), pinned = rate(true);
    const bool use_pin = !c.o.cfg || c.cfg.data.pin_memory;
    rep.add({"data.pinned_copy",
             "data",
             use_pin && pinned >= pageable ? "PASS" : "WARN",
             "pageable " + format_fixed(pageable) + " GB/s, pinned " + format_fixed(pinned) +
                 " GB/s; data.pin_memory=" + (use_pin ? "true" : "false"),
             "pinned >= pageable, and pin_memory on",
             "pinned buffers copy by DMA, asynchronously with compute",
             use_pin ? "" : "set data.pin_memory=true",
             {{"pageable_gb_s", pageable}, {"pinned_gb_s", pinned}}});
  }
}

void gemm_check(const Context& c, Report& rep) {
  {
    const int64_t n = c.full ? 2048 : 1024;
    auto a = torch::randn({n, n}), b = torch::randn({n, n});
    torch::mm(a, b);
    double best = 1e9;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = Clock::now();
      torch::mm(a, b);
      best = std::min(best, seconds_since(t0));
    }
    const double gflops = 2.0 * n * n * n / best / 1e9;
    auto j = judge_gemm(gflops);
    Item it{
        "compute.gemm",
        "compute",
        j["status"].get<std::string>(),
        "fp32 " + std::to_string(n) + "^3 GEMM: " + format_fixed(gflops) + " GFLOP/s via " +
            (runtime::kernel_route() == "onednn" ? std::string("oneDNN sgemm (kernel route)")
                                                 : runtime::kernels()["blas"].get<std::string>()),
        j["expected"].get<std::string>(),
        "Linear/matmul dominate MLPs and heads; a reference BLAS is 40x slower than MKL",
        j["status"] == "PASS" ? ""
                              : "runtime.kernel_route=onednn (the default), and check "
                                "OMP_NUM_THREADS/runtime.threads",
        {{"gflops", gflops}}};
    if (c.cuda) {
      auto ga = torch::randn({8192, 8192}, torch::dtype(torch::kBFloat16).device(c.device)),
           gb = ga.clone();
      torch::mm(ga, gb);
      compat::cuda_synchronize();
      const auto t0 = Clock::now();
      for (int i = 0; i < 10; ++i) torch::mm(ga, gb);
      compat::cuda_synchronize();
      const double tflops = 10 * 2.0 * 8192.0 * 8192.0 * 8192.0 / seconds_since(t0) / 1e12;
      it.measured += "; GPU bf16 8192^3: " + format_fixed(tflops) + " TFLOP/s";
      it.value["gpu_bf16_tflops"] = tflops;
    }
    rep.add(it);
  }
}

void cudnn_check(const Context& c, Report& rep) {
  if (!c.cuda) {
    rep.skip("compute.cudnn_benchmark", "compute", c.no_cuda,
             "cuDNN autotuning pays off when input shapes repeat");
  } else {
    const bool fixed = !c.o.cfg || c.cfg.data.drop_last;
    const bool on = c.o.cfg ? c.cfg.runtime.cudnn_benchmark : compat::cudnn_benchmark();
    rep.add({"compute.cudnn_benchmark",
             "compute",
             on || !fixed ? "PASS" : "WARN",
             std::string("cudnn_benchmark=") + (on ? "on" : "off") + ", input shapes " +
                 (fixed ? "fixed (drop_last)" : "vary (last batch)"),
             "on when shapes are fixed",
             "autotuning picks the fastest convolution per shape, once",
             on ? "" : "runtime.cudnn_benchmark=true",
             {{"on", on}, {"fixed_shapes", fixed}}});
  }
}

// Which heavy ops run in 16-bit under the config's autocast, and the conv->BN pairs to fold.
void autocast_and_fusion_checks(const Context& c, Report& rep) {
  if (!c.o.cfg) {
    rep.skip("compute.autocast_coverage", "compute", c.no_cfg,
             "autocast runs matmul-like ops in 16-bit");
    rep.skip("compute.fusion", "compute", c.no_cfg,
             "conv->BN pairs fold into one conv for inference");
  } else {
    const auto dtype = c.cuda && c.cfg.amp.dtype == "fp16" ? at::kHalf : at::kBFloat16;
    auto shape = c.splits->train.sample_shape;
    shape.insert(shape.begin(), 8);
    auto x = torch::randn(shape).to(c.device);
    OpProfiler prof({true, 1000});
    c.model->set_training(true);
    prof.start();
    {
      torch::NoGradGuard ng;
      compat::AutocastGuard ac(true, dtype, c.cuda);
      c.model->forward(x);
    }
    prof.stop();
    std::vector<std::string> low, fp32;
    for (const auto& [op, m] : prof.dtypes()) {
      const bool heavy =
          op.find("conv") != std::string::npos || op.find("linear") != std::string::npos ||
          op.find("mm") != std::string::npos || op.find("matmul") != std::string::npos;
      if (!heavy || op.find("::_") != std::string::npos) continue;  // the public op names
      bool is_low = false;
      for (const auto& [k, v] : m) is_low |= k.rfind("bf16", 0) == 0 || k.rfind("fp16", 0) == 0;
      (is_low ? low : fp32).push_back(op);
    }
    std::string lows, f32s;
    for (auto& s : low) lows += (lows.empty() ? "" : ", ") + s;
    for (auto& s : fp32) f32s += (f32s.empty() ? "" : ", ") + s;
    const std::string dn = dtype == at::kHalf ? "fp16" : "bf16";
    // On a CPU, bf16 pays only with native bf16 dot products (AVX512-BF16, AMX); elsewhere oneDNN
    // emulates it and autocast is slower than fp32, so "amp off" is then the right answer.
    const bool native = c.cuda || runtime::cpu_has_native_bf16();
    std::string status = !fp32.empty() ? "WARN" : (c.cfg.amp.enabled == native ? "PASS" : "WARN");
    rep.add(
        {"compute.autocast_coverage",
         "compute",
         status,
         "under " + dn + " autocast: " + (lows.empty() ? "none" : lows) + " in " + dn +
             (f32s.empty() ? "" : "; stayed fp32: " + f32s) +
             "; amp.enabled=" + (c.cfg.amp.enabled ? "true" : "false") +
             (c.cuda   ? ""
              : native ? "; this CPU has native bf16"
                       : "; this CPU has no native bf16"),
         native ? "conv/linear/matmul in 16-bit, amp on" : "amp off (bf16 emulated on this CPU)",
         "16-bit matmuls run 1.6x faster on CPUs with AVX512-BF16 or AMX and far faster on "
         "GPUs; without native bf16 a CPU emulates it, slower than fp32",
         !native ? (c.cfg.amp.enabled ? "amp.enabled=false" : "")
         : c.cfg.amp.enabled
             ? (fp32.empty() ? "" : "ops left in fp32 fall back: check their input dtypes")
             : "amp.enabled=true amp.dtype=" +
                   std::string(c.cuda ? "bf16 (or fp16 with the loss scaler)" : "bf16"),
         {{"low_precision", low}, {"fp32", fp32}, {"native_bf16", native}}});
    const int pairs = count_conv_bn_pairs(*c.model);
    rep.add({"compute.fusion",
             "compute",
             "PASS",
             std::to_string(pairs) + " conv->BatchNorm pair(s) in " + c.model->describe(),
             "informational",
             "at inference each pair folds into one conv (no BN pass, less memory traffic)",
             pairs > 0 ? "fold them for deployment: mltrain fuse RUN_DIR" : "",
             {{"conv_bn_pairs", pairs}}});
  }
}

// Kernel settings: swappiness, transparent huge pages, the CPU governor.
void kernel_settings_checks(Report& rep) {
  {
    const std::string s = read_first_line("/proc/sys/vm/swappiness");
    if (s.empty()) {
      rep.skip("system.swappiness", "system", "/proc/sys/vm/swappiness is not readable",
               "swapping training memory stalls steps");
    } else {
      const int v = std::stoi(s);
      auto j = judge_swappiness(v);
      rep.add({"system.swappiness",
               "system",
               j["status"].get<std::string>(),
               "vm.swappiness=" + s,
               j["expected"].get<std::string>(),
               "a high value lets the kernel swap out the data set and activations under memory "
               "pressure",
               j["status"] == "PASS" ? "" : "sysctl -w vm.swappiness=10 (root)",
               {{"swappiness", v}}});
    }
  }
  {
    const std::string s = read_first_line("/sys/kernel/mm/transparent_hugepage/enabled");
    if (s.empty()) {
      rep.skip("system.transparent_hugepages", "system", "no /sys/kernel/mm/transparent_hugepage",
               "huge pages cut TLB misses");
    } else {
      const bool never = s.find("[never]") != std::string::npos;
      rep.add({"system.transparent_hugepages", "system", never ? "WARN" : "PASS", s,
               "[always] or [madvise]",
               "large tensors on huge pages take fewer TLB misses and page faults",
               never ? "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (root)" : "",
               s});
    }
  }
  {
    const std::string g = read_first_line("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor");
    if (g.empty()) {
      rep.skip("system.cpu_governor", "system",
               "no cpufreq interface (virtual machine or container): the host decides",
               "a power-saving governor lowers clocks between bursts");
    } else {
      rep.add({"system.cpu_governor", "system", g == "performance" ? "PASS" : "WARN", g,
               "performance", "a power-saving governor lowers clocks between bursts",
               g == "performance" ? "" : "cpupower frequency-set -g performance", g});
    }
  }
}

// This process: threads against cores, the allocator (measured first), NUMA nodes, open files.
void process_checks(const Context& c, Report& rep, const Item& allocator) {
  {
    const int cores = runtime::usable_cores();
    const int threads = at::get_num_threads();
    // The rule with this node's GPUs, as a run on it would resolve data.workers: auto.
    const int64_t gpus = compat::cuda_available() ? compat::cuda_device_count() : 0;
    const int64_t rule = data::auto_workers(cores, gpus);
    const int64_t workers = c.o.cfg ? c.cfg.data.workers.resolve(rule) : rule;
    auto j = judge_threads(threads, cores);
    rep.add({"system.threads",
             "system",
             j["status"].get<std::string>(),
             std::to_string(threads) + " intra-op thread(s) on " + std::to_string(cores) +
                 " usable core(s); " + std::to_string(workers) + " loader worker(s)",
             j["expected"].get<std::string>(),
             "LibTorch defaulted to 1 thread here; more threads than cores thrash",
             j["status"] == "PASS" ? "" : "runtime.threads=auto",
             {{"threads", threads}, {"cores", cores}, {"workers", workers}}});
  }
  rep.add(allocator);
  {
    int nodes = 0;
    std::error_code ec;
    if (fs::exists("/sys/devices/system/node", ec))
      for (const auto& e : fs::directory_iterator("/sys/devices/system/node", ec)) {
        const auto n = e.path().filename().string();
        if (n.rfind("node", 0) == 0 && n.size() > 4 &&
            std::isdigit(static_cast<unsigned char>(n[4])))
          ++nodes;
      }
    if (nodes == 0) {
      rep.skip("system.numa", "system", "no /sys/devices/system/node",
               "memory on a remote NUMA node is slower");
    } else {
      rep.add({"system.numa",
               "system",
               nodes == 1 ? "PASS" : "WARN",
               std::to_string(nodes) + " NUMA node(s)",
               "1 node, or one rank per node bound to it",
               "memory on a remote NUMA node is slower to reach",
               nodes == 1 ? "" : "one rank per NUMA node: numactl --cpunodebind=N --membind=N",
               {{"nodes", nodes}}});
    }
  }
  {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    const double soft = rl.rlim_cur == RLIM_INFINITY ? 1e9 : static_cast<double>(rl.rlim_cur);
    rep.add({"system.open_files",
             "system",
             soft >= 4096 ? "PASS" : "WARN",
             "ulimit -n = " + format_fixed(soft, 0),
             ">= 4096",
             "loader workers, memory-mapped shards and process-group sockets each hold descriptors",
             soft >= 4096 ? "" : "ulimit -n 65536 (or LimitNOFILE in the service / Slurm prolog)",
             {{"soft_limit", soft}}});
  }
}

// Room under run.dir for the checkpoints the config keeps.
void disk_check(const Context& c, Report& rep) {
  {
    fs::path p = fs::absolute(c.cfg.run.dir);
    while (!p.empty() && !fs::exists(p)) p = p.parent_path();
    struct statvfs sv {};
    if (::statvfs(p.c_str(), &sv) != 0) {
      rep.skip("system.disk_space", "system", "cannot stat " + p.string(), "checkpoints need room");
    } else {
      const double free_b = static_cast<double>(sv.f_bavail) * sv.f_frsize;
      if (!c.o.cfg) {
        rep.add({"system.disk_space",
                 "system",
                 free_b > 1e9 ? "PASS" : "WARN",
                 format_fixed(free_b / 1e9) + " GB free under " + p.string(),
                 "> 1 GB (give a config for its checkpoint size)",
                 "a full disk fails the checkpoint write",
                 "",
                 {{"free_bytes", free_b}}});
      } else {
        const double ck = static_cast<double>(checkpoint_bytes(c.cfg, *c.model));
        const double copies =
            static_cast<double>(c.cfg.checkpoint.keep_last + c.cfg.checkpoint.keep_best + 1);
        auto j = judge_disk(free_b, ck * copies);
        rep.add({"system.disk_space",
                 "system",
                 j["status"].get<std::string>(),
                 format_fixed(free_b / 1e9, 2) + " GB free under " + p.string() +
                     "; a checkpoint is " + format_fixed(ck / 1e6, 2) + " MB x " +
                     format_fixed(copies, 0) +
                     " kept (keep_last + keep_best + the one being written)",
                 j["expected"].get<std::string>(),
                 "a checkpoint that cannot be written loses the run's progress",
                 j["status"] == "PASS"
                     ? ""
                     : "free space, lower checkpoint.keep_last/keep_best, or move run.dir",
                 {{"free_bytes", free_b}, {"checkpoint_bytes", ck}, {"copies", copies}}});
      }
    }
  }
}

// Versions, and a real NCCL all-reduce through the helper process.
void gpu_checks(const Context& c, Report& rep) {
  if (!c.cuda) {
    rep.skip("gpu.versions", "gpu", c.no_cuda,
             "driver, CUDA, cuDNN and NCCL must match what LibTorch was built for");
    rep.skip("gpu.nccl_allreduce", "gpu", c.no_cuda,
             "all-reduce bandwidth bounds data-parallel scaling");
  } else {
    const auto v = compat::cuda_versions();
    std::string driver = read_first_line("/proc/driver/nvidia/version");
    if (auto k = driver.find("Kernel Module"); k != std::string::npos)
      driver = driver.substr(k + 14, 20);
    const auto nccl = dist::nccl_allreduce_check(c.full ? 1 << 30 : 256 << 20, c.full ? 20 : 10,
                                                 c.full ? 180 : 60);
    rep.add({"gpu.versions",
             "gpu",
             "PASS",
             compat::cuda_device_name() + "; driver " + (driver.empty() ? "?" : driver) +
                 ", CUDA " + v.cuda + " (LibTorch " + compat::torch_version() + "), cuDNN " +
                 v.cudnn + ", NCCL " + (nccl.version.empty() ? "?" : nccl.version),
             "informational",
             "mismatched versions are the first thing to rule out",
             "",
             {{"device", compat::cuda_device_name()},
              {"cuda", v.cuda},
              {"cudnn", v.cudnn},
              {"nccl", nccl.version}}});
    if (!nccl.ok) {
      rep.add({"gpu.nccl_allreduce", "gpu", dist::nccl_compiled() ? "FAIL" : "SKIP", nccl.error,
               "an all-reduce completes", "data-parallel training all-reduces every step",
               dist::nccl_compiled() ? "check the NCCL install" : nccl.error, nullptr});
    } else {
      rep.add(
          {"gpu.nccl_allreduce",
           "gpu",
           "PASS",
           "ProcessGroupNCCL, world " + std::to_string(nccl.world) + ": " +
               format_fixed(nccl.bytes / (1 << 20), 0) + " MiB in " +
               format_fixed(nccl.seconds * 1e3, 3) + " ms, algbw " + format_fixed(nccl.algbw_gbps) +
               " GB/s, busbw " + format_fixed(nccl.busbw_gbps) + " GB/s" +
               (nccl.world == 1 ? " (busbw is 0 by definition with one rank: no link is crossed)"
                                : ""),
           "completes; busbw near the link's rate with several GPUs",
           "all-reduce bandwidth bounds data-parallel scaling",
           "",
           {{"algbw_gb_s", nccl.algbw_gbps},
            {"busbw_gb_s", nccl.busbw_gbps},
            {"world", nccl.world}}});
    }
  }
}

}  // namespace

ChecklistReport run_checklist(const ChecklistOptions& o) {
  const auto t_start = Clock::now();
  const config::ExperimentConfig defaults;
  const config::ExperimentConfig& cfg = o.cfg ? *o.cfg : defaults;
  // With a config, its pipeline up to the model (runtime policy, device, splits); without one, the
  // runtime policy of the defaults on this node.
  std::unique_ptr<train::Pipeline> pipe;
  if (o.cfg) {
    pipe = train::build_pipeline(cfg, dist::World{}, train::model_only());
  } else {
    runtime::apply({train::resolve_threads(cfg, dist::World{}), cfg.runtime.allocator,
                    cfg.runtime.kernel_route});
  }
  Context c{o, cfg, false, false, torch::kCPU, nullptr, nullptr, {}, {}};
  c.full = o.level == "full";
  c.device = pipe ? pipe->device : compat::resolve_device("auto");
  c.cuda = c.device.is_cuda();
  c.splits = pipe ? &pipe->splits : nullptr;
  c.model = pipe ? pipe->model.get() : nullptr;
  c.no_cfg = "no config given: run `mltrain checklist CONFIG.yaml` to check a pipeline";
  c.no_cuda = compat::cuda_built() ? "no CUDA device visible" : "CPU build of mltrain (no CUDA)";

  ChecklistReport rep;
  const Item allocator = allocator_check(c);  // first: see allocator_check
  const double cold_mbs = read_bandwidth_check(c, rep);
  loader_checks(c, rep, cold_mbs);
  pinned_copy_check(c, rep);
  gemm_check(c, rep);
  cudnn_check(c, rep);
  autocast_and_fusion_checks(c, rep);
  kernel_settings_checks(rep);
  process_checks(c, rep, allocator);
  disk_check(c, rep);
  gpu_checks(c, rep);
  rep.level = o.level;
  rep.config = o.config_path;
  rep.device = c.device.str();
  rep.seconds = seconds_since(t_start);
  return rep;
}

void ChecklistReport::skip(const std::string& id, const std::string& area,
                           const std::string& reason, const std::string& why) {
  add({id, area, "SKIP", "", "", why, reason, nullptr});
}

std::map<std::string, int> ChecklistReport::counts() const {
  std::map<std::string, int> n = {{"PASS", 0}, {"WARN", 0}, {"FAIL", 0}, {"SKIP", 0}};
  for (const auto& i : items) ++n[i.status];
  return n;
}

nlohmann::json ChecklistReport::to_json() const {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& i : items)
    arr.push_back({{"id", i.id},
                   {"area", i.area},
                   {"status", i.status},
                   {"measured", i.measured},
                   {"expected", i.expected},
                   {"why", i.why},
                   {"fix", i.fix},
                   {"value", i.value}});
  return {{"items", arr},     {"counts", counts()}, {"level", level},
          {"config", config}, {"device", device},   {"seconds", seconds}};
}

std::string ChecklistReport::to_text() const {
  std::ostringstream o;
  o << "mltrain checklist (" << level << (config.empty() ? "" : ", " + config) << ", " << device
    << ")\n";
  std::string area;
  for (const auto& it : items) {
    if (it.area != area) {
      area = it.area;
      o << "\n" << area << "\n";
    }
    o << "  " << it.status << std::string(5 - it.status.size(), ' ') << it.id << ": ";
    if (it.status == "SKIP") {
      o << "skipped: " << it.fix << "\n";
      continue;
    }
    o << it.measured << "\n";
    o << "        expected " << it.expected << "; why: " << it.why << "\n";
    if (!it.fix.empty()) o << "        fix: " << it.fix << "\n";
  }
  auto n = counts();
  o << "\n"
    << n["PASS"] << " pass, " << n["WARN"] << " warn, " << n["FAIL"] << " fail, " << n["SKIP"]
    << " skip in " << format_fixed(seconds) << " s\n";
  return o.str();
}

}  // namespace mltrain::checklist
