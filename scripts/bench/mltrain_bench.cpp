// Benchmark driver (never a timed test): prints one JSON line per measurement.
//
//   mltrain_bench bare   CONFIG [k=v ...]  fixed batch: forward + loss + backward + optimizer step only
//   mltrain_bench train  CONFIG [k=v ...]  the real Trainer loop (loader, observers) for train.duration
//   mltrain_bench loader CONFIG [k=v ...]  loader only: shuffled, normalised float batches
//   mltrain_bench memory CONFIG [k=v ...]  the task's forward + backward + step on real batches:
//                                          activation peak (tensor memory above what is live
//                                          before the step) and median step time
//
// Steps come from train.duration (e.g. train.duration=300u); the first `warmup` steps are not timed.
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "mltrain/config/experiment.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/runtime/memory.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/task/task.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/train/observers.hpp"
#include "mltrain/train/pipeline.hpp"
#include "mltrain/train/trainer.hpp"

using namespace mltrain;
using Clock = std::chrono::steady_clock;

static double secs(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

static int bench_main(int argc, char** argv);

int main(int argc, char** argv) {
  mltrain::compat::cuda_plugin();  // before any LibTorch call, as mltrain's main (cuda_plugin.hpp)
  try {
    return bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

// mltrain_bench gemm native|onednn [THREADS [MxKxN ...]]: fp32 GEMM throughput per kernel route
// (native: LibTorch's BLAS, MKL in the wheel; onednn: oneDNN's sgemm), at the given shapes or three
// of the registry models'.
static int bench_gemm(int argc, char** argv) {
  runtime::apply({std::stoi(argc > 3 ? argv[3] : "0"), "retain", argv[2]});
  std::vector<std::array<int64_t, 3>> shapes = {{128, 784, 512}, {128, 3136, 256}, {512, 512, 512}};
  if (argc > 4) shapes.clear();
  for (int i = 4; i < argc; ++i) {
    std::array<int64_t, 3> s{};
    if (std::sscanf(argv[i], "%ldx%ldx%ld", &s[0], &s[1], &s[2]) != 3)
      throw std::invalid_argument(std::string("gemm shape '") + argv[i] + "': write MxKxN");
    shapes.push_back(s);
  }
  for (auto [m, k, n] : shapes) {
    auto a = torch::randn({m, k}), b = torch::randn({k, n});
    for (int i = 0; i < 3; ++i) torch::mm(a, b);
    int iters = 0;
    auto t0 = Clock::now();
    while (secs(t0) < 0.5 || iters < 3) torch::mm(a, b), ++iters;
    std::cout << nlohmann::json{{"mode", "gemm"},
                                {"route", runtime::kernel_route()},
                                {"threads", at::get_num_threads()},
                                {"m", m},
                                {"k", k},
                                {"n", n},
                                {"gflops", 2.0 * m * k * n * iters / secs(t0) / 1e9}}
                     .dump()
              << std::endl;
  }
  return 0;
}

// The loader alone: samples/s it supplies with the config's options and augmentation (decoding,
// augmenting, normalising and batching).
static void bench_loader(const config::ExperimentConfig& cfg, const train::Splits& splits,
                         const data::LoaderOptions& lo, int64_t steps, int64_t warmup,
                         nlohmann::json& out) {
  const auto owned = train::augmented_loader(cfg, splits.train, lo);
  data::Loader& loader = *owned;
  int64_t n = 0, epoch = 0;
  data::Batch b;
  double sink = 0;
  auto t0 = Clock::now();
  while (n < steps) {
    loader.start_epoch(epoch++);
    while (n < steps && loader.next(b)) {
      sink += b.x.data_ptr<float>()[0];  // touch the batch
      if (++n == warmup) t0 = Clock::now();
    }
  }
  out["workers"] = lo.workers;
  out["samples_per_s"] = (steps - warmup) * lo.batch_size / secs(t0);
  out["sink"] = sink;
}

// The baseline: the same model and optimizer in a bare loop over one resident batch.
static void bench_bare(train::Pipeline& base, const config::ExperimentConfig& cfg,
                       const data::LoaderOptions& lo, int64_t steps, int64_t warmup,
                       nlohmann::json& out) {
  const train::Splits& splits = base.splits;
  auto& model = base.model;
  auto opt = optim::Optimizer::create(cfg.optim, model->named_parameters());
  data::Loader loader(splits.train, lo);
  loader.start_epoch(0);
  data::Batch b;
  loader.next(b);
  auto x = b.x.clone(), y = b.y.clone();
  const int64_t f0 = runtime::minor_faults();
  auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    if (i == warmup) t0 = Clock::now();
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    opt->zero_grad();
    loss.backward();
    opt->step(cfg.optim.lr);
  }
  out["samples_per_s"] = (steps - warmup) * lo.batch_size / secs(t0);
  out["minor_faults_per_step"] = double(runtime::minor_faults() - f0) / steps;
}

// The real Trainer loop (loader, observers) through the pipeline seam.
static void bench_train(const config::ExperimentConfig& cfg, const train::Splits& splits,
                        const data::LoaderOptions& lo, int64_t steps, int64_t warmup,
                        nlohmann::json& out) {
  // Warm-up run (allocator, oneDNN kernel caches), then the timed run of a fresh pipeline.
  auto warm_cfg = cfg;
  warm_cfg.train.duration = config::Period::steps(warmup);
  train::PipelineOptions po;
  po.splits = &splits;
  train::build_pipeline(warm_cfg, dist::World{}, po)->trainer->fit();
  const auto p = train::build_pipeline(cfg, dist::World{}, po);
  train::Trainer& trainer = *p->trainer;
  auto tmp = std::filesystem::temp_directory_path() / "mltrain_bench_run";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  trainer.add_observer(std::make_unique<train::MetricsWriter>(tmp));
  const int64_t f0 = runtime::minor_faults();
  auto t0 = Clock::now();
  trainer.fit();
  const double s = secs(t0);
  out["workers"] = lo.workers;
  out["samples_per_s"] = steps * lo.batch_size / s;
  out["data_wait_share"] = trainer.data_wait_seconds() / s;
  out["minor_faults_per_step"] = double(runtime::minor_faults() - f0) / steps;
}

// Peak activation memory and step time of the task's own step (memory.checkpoint compared by
// scripts/bench/memory.sh): per step, the tensor-memory peak above what was live before it
// (weights, gradients, optimizer state, the batch), by the counting allocator on the CPU and
// max_memory_allocated on CUDA.
static void bench_memory(const config::ExperimentConfig& cfg, const train::Splits& splits,
                         int64_t steps, int64_t warmup, nlohmann::json& out) {
  train::PipelineOptions po;
  po.splits = &splits;
  const auto p = train::build_pipeline(cfg, dist::World{}, po);
  const auto task = task::make_task(cfg);
  const task::Amp amp = task::amp_of(cfg.amp, p->device.is_cuda());
  p->model->set_training(true);
  std::vector<double> times;
  int64_t peak = 0, epoch = 0;
  data::Batch b;
  p->train_loader->start_epoch(epoch);
  for (int64_t i = 0; i < steps; ++i) {
    if (!p->train_loader->next(b)) {
      p->train_loader->start_epoch(++epoch);
      p->train_loader->next(b);
    }
    b.x = b.x.to(p->device), b.y = b.y.to(p->device);
    compat::cuda_synchronize();
    const int64_t live = memory::stats(p->device).live;
    memory::reset_peak(p->device);
    const auto t0 = Clock::now();
    task->forward(*p->model, b, 0.0, amp).loss.backward();
    p->optimizer->step(cfg.optim.lr);
    p->optimizer->zero_grad();
    compat::cuda_synchronize();
    if (i >= warmup) {
      times.push_back(secs(t0));
      peak = std::max(peak, memory::stats(p->device).peak - live);
    }
  }
  std::sort(times.begin(), times.end());
  out["checkpoint"] = cfg.memory.checkpoint;
  out["activation_peak_mib"] = peak / 1048576.0;
  out["step_ms_median"] = times.empty() ? 0.0 : 1e3 * times[times.size() / 2];
  out["device"] = p->device.str();
}

static int bench_main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: mltrain_bench bare|train|loader|memory CONFIG [key=value ...]\n";
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "gemm") return bench_gemm(argc, argv);
  std::vector<std::string> ov(argv + 3, argv + argc);
  if (mode == "memory") memory::track_cpu();  // before any tensor of the run exists
  auto cfg = config::load_experiment(argv[2], ov);
  cfg.train.eval_every = config::Period::never();
  // The pipeline as `mltrain train` builds it (runtime policy, device, splits, model).
  const auto base = train::build_pipeline(cfg, dist::World{}, train::model_only());
  const train::Splits& splits = base->splits;
  const int64_t steps = cfg.train.duration.to_steps(splits.train.count / cfg.data.batch_size);
  const int64_t warmup = std::min<int64_t>(20, steps / 5);

  const data::LoaderOptions lo = train::train_loader_options(cfg, base->device, &splits.train);
  nlohmann::json out = {{"mode", mode},
                        {"model", cfg.model.name},
                        {"batch", lo.batch_size},
                        {"threads", at::get_num_threads()},
                        {"route", runtime::kernel_route()},
                        {"allocator", cfg.runtime.allocator}};

  if (mode == "loader") {
    bench_loader(cfg, splits, lo, steps, warmup, out);
  } else if (mode == "bare") {
    bench_bare(*base, cfg, lo, steps, warmup, out);
  } else if (mode == "train") {
    bench_train(cfg, splits, lo, steps, warmup, out);
  } else if (mode == "memory") {
    bench_memory(cfg, splits, steps, warmup, out);
  } else {
    std::cerr << "unknown mode " << mode << "\n";
    return 2;
  }
  out["peak_rss_mib"] = runtime::peak_rss_kib() / 1024.0;
  std::cout << out.dump() << std::endl;
  return 0;
}
