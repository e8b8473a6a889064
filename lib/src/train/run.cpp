#include "mltrain/train/run.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>
#include <iostream>

#include "mltrain/config/format.hpp"
#include "mltrain/core/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/runtime.hpp"
#include "mltrain/core/signals.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/train/observers.hpp"
#include "mltrain/dist/ddp.hpp"
#include "mltrain/dist/world.hpp"
#include "mltrain/train/trainer.hpp"

#ifndef MLTRAIN_GIT_DESCRIBE
#define MLTRAIN_GIT_DESCRIBE "unknown"
#endif

namespace fs = std::filesystem;

namespace mltrain::train {

Splits load_splits(const config::DataConfig& c) {
  std::string tri = c.train_images, trl = c.train_labels, tei = c.test_images, tel = c.test_labels;
  if (c.dataset == "fashion_mnist") {
    const fs::path r = c.root;
    tri = (r / "train-images-idx3-ubyte.gz").string();
    trl = (r / "train-labels-idx1-ubyte.gz").string();
    tei = (r / "t10k-images-idx3-ubyte.gz").string();
    tel = (r / "t10k-labels-idx1-ubyte.gz").string();
    if (!fs::exists(tri))
      throw DataError(tri, "Fashion-MNIST not found",
                      "run scripts/install-deps.sh (Debian package dataset-fashion-mnist) or set data.root");
  }
  Splits s;
  s.train = data::load_dataset(tri, trl, c.num_classes);
  s.test = data::load_dataset(tei, tel, c.num_classes);
  if (s.train.sample_shape != s.test.sample_shape)
    throw DataError(tei, "sample shape differs from the training set's", "pair matching train and test files");
  if (c.limit_train > 0) s.train = s.train.slice(0, c.limit_train);
  if (c.val_fraction > 0) {
    const int64_t nval = static_cast<int64_t>(s.train.count * c.val_fraction);
    s.eval = s.train.slice(s.train.count - nval, s.train.count);
    s.train = s.train.slice(0, s.train.count - nval);
    s.eval_name = "val";
  } else {
    s.eval = s.test;
    s.eval_name = "test";
  }
  return s;
}

data::LoaderOptions train_loader_options(const config::ExperimentConfig& cfg, const torch::Device& device) {
  data::LoaderOptions lo;
  lo.batch_size = cfg.data.batch_size;
  lo.workers = cfg.data.workers.resolve(data::auto_workers(runtime::usable_cores()));
  lo.prefetch = cfg.data.prefetch;
  lo.shuffle = cfg.data.shuffle;
  lo.drop_last = cfg.data.drop_last;
  lo.seed = static_cast<uint64_t>(cfg.run.seed);
  lo.mean = static_cast<float>(cfg.data.mean);
  lo.std = static_cast<float>(cfg.data.std);
  lo.pin_memory = device.is_cuda() && cfg.data.pin_memory;
  return lo;
}

data::LoaderOptions plain_loader_options(const config::ExperimentConfig& cfg, int64_t batch_size, bool shuffle,
                                         bool drop_last) {
  data::LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.shuffle = shuffle;
  lo.drop_last = drop_last;
  lo.seed = static_cast<uint64_t>(cfg.run.seed);
  lo.mean = static_cast<float>(cfg.data.mean);
  lo.std = static_cast<float>(cfg.data.std);
  return lo;
}

// `gpu`: which GPU (a data-parallel rank's LOCAL_RANK; torchrun's and srun's convention of one
// GPU per local rank).
torch::Device prepare_device(const config::ExperimentConfig& cfg, int gpu) {
  if (cfg.runtime.device == "cuda" && !compat::cuda_available())
    throw ConfigError("runtime.device", "cuda asked for, but " +
                                            std::string(compat::cuda_built() ? "no CUDA device is visible"
                                                                             : "this mltrain was built without CUDA"),
                      "use runtime.device=auto or cpu, or build with -DMLTRAIN_WITH_CUDA=ON against a CUDA LibTorch");
  const torch::Device device = compat::resolve_device(cfg.runtime.device, gpu);
  if (device.is_cuda()) {
    if (gpu >= compat::cuda_device_count())
      throw ConfigError("runtime.device", "local rank " + std::to_string(gpu) + " needs GPU " + std::to_string(gpu) + ", and " +
                                              std::to_string(compat::cuda_device_count()) + " are visible",
                        "start at most one rank per GPU (--nproc-per-node / --ntasks-per-node), or check CUDA_VISIBLE_DEVICES");
    compat::set_cuda_device(gpu);
    compat::set_cudnn_benchmark(cfg.runtime.cudnn_benchmark);
  }
  return device;
}

fs::path choose_run_dir(const config::ExperimentConfig& cfg, bool* resuming) {
  const fs::path base = fs::path(cfg.run.dir) / cfg.run.name;
  int64_t newest = -1;
  if (fs::exists(base))
    for (const auto& e : fs::directory_iterator(base)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.size() > 1 && n[0] == 'v' && n.find_first_not_of("0123456789", 1) == std::string::npos)
        newest = std::max<int64_t>(newest, std::stoll(n.substr(1)));
    }
  *resuming = false;
  if (newest >= 0 && cfg.checkpoint.resume == "auto") {
    const fs::path d = base / ("v" + std::to_string(newest));
    std::string state;
    try {
      std::ifstream in(d / "status.json");
      if (in) state = nlohmann::json::parse(in).value("state", "");
    } catch (const std::exception&) {
    }
    if (state != "finished" && fs::exists(d / "checkpoints")) {
      *resuming = true;
      return d;
    }
  }
  return base / ("v" + std::to_string(newest + 1));
}

namespace {
// Test hooks for the distributed tests, off unless their variables are set:
//   MLTRAIN_TEST_PARAM_DIGEST=PREFIX  each rank appends "<step> <FNV-1a of every parameter's bytes>"
//                                     to PREFIX.<rank> after every step (bitwise-equality check)
//   MLTRAIN_TEST_KILL=RANK:STEP       that rank SIGKILLs itself at that step on the first attempt
//                                     (TORCHELASTIC_RESTART_COUNT unset or 0): a real dead worker
//   MLTRAIN_TEST_STALL=RANK:STEP      that rank stops making progress at that step (sleeps until
//                                     killed): a hung worker, alive but silent
class TestHooks : public Observer {
 public:
  TestHooks(model::Model& m, int rank) : model_(m), rank_(rank) {
    if (const char* d = std::getenv("MLTRAIN_TEST_PARAM_DIGEST")) digest_ = std::string(d) + "." + std::to_string(rank);
    if (const char* k = std::getenv("MLTRAIN_TEST_KILL")) {
      const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
      if (!restart || std::string(restart) == "0") std::sscanf(k, "%d:%ld", &kill_rank_, &kill_step_);
    }
    if (const char* k = std::getenv("MLTRAIN_TEST_STALL")) std::sscanf(k, "%d:%ld", &stall_rank_, &stall_step_);
  }
  bool active() const { return !digest_.empty() || kill_rank_ >= 0 || stall_rank_ >= 0; }
  void on_step_end(Trainer& t, const StepInfo&) override {
    if (!digest_.empty()) {
      uint64_t h = 1469598103934665603ULL;
      for (auto& [n, p] : model_.named_parameters()) {
        const auto c = p.detach().contiguous().cpu();
        const auto* b = static_cast<const unsigned char*>(c.data_ptr());
        for (size_t i = 0, e = size_t(c.numel()) * c.element_size(); i < e; ++i) h = (h ^ b[i]) * 1099511628211ULL;
      }
      std::ofstream(digest_, std::ios::app) << t.progress().step << " " << h << "\n";
    }
    if (kill_rank_ == rank_ && t.progress().step == kill_step_) ::raise(SIGKILL);
    if (stall_rank_ == rank_ && t.progress().step == stall_step_)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }

 private:
  model::Model& model_;
  int rank_;
  std::string digest_;
  int kill_rank_ = -1, stall_rank_ = -1;
  long kill_step_ = -1, stall_step_ = -1;
};
}  // namespace

static void write_status(const fs::path& dir, const std::string& state, int64_t step, const std::string& detail = "") {
  nlohmann::json j = {{"state", state}, {"step", step}, {"pid", ::getpid()}};
  if (!detail.empty()) j["detail"] = detail;
  write_file_atomic((dir / "status.json").string(), j.dump(2) + "\n");
}

static nlohmann::json env_json(const config::ExperimentConfig& cfg, const RunOptions& opt) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  nlohmann::json j = runtime::describe();
  j["mltrain"] = MLTRAIN_GIT_DESCRIBE;
  j["host"] = host;
  j["seed"] = cfg.run.seed;
  j["command"] = opt.command_line;
  for (const char* v : {"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "RANK", "WORLD_SIZE"})
    if (const char* val = std::getenv(v)) j["env"][v] = val;
  return j;
}

RunResult run_training(const config::ExperimentConfig& cfg, const RunOptions& opt) {
  const dist::World world = dist::world_from_env();
  const bool distributed = world.size > 1;
  // Auto threads: OMP_NUM_THREADS when the environment sets it (torchrun sets 1 unless told
  // otherwise), as PyTorch does; else ranks on one node split its cores between them.
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int omp_threads = omp ? std::atoi(omp) : 0;
  const int threads = !cfg.runtime.threads.is_auto() ? static_cast<int>(cfg.runtime.threads.resolve(0))
                      : omp_threads > 0            ? omp_threads
                      : distributed                ? std::max(1, runtime::usable_cores() / std::max(1, world.local_size))
                                                   : 0;
  runtime::apply({threads, cfg.runtime.kernel_route, cfg.runtime.allocator});
  const torch::Device device = prepare_device(cfg, distributed ? world.local_rank : 0);
  if (distributed && world.rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 alone logs to the console

  // Data, model and optimizer first: bad input fails before any run folder is created.
  Splits splits = load_splits(cfg.data);

  data::LoaderOptions lo = train_loader_options(cfg, device);
  lo.rank = world.rank, lo.world = world.size;  // each rank its shard of one global shuffle
  if (distributed && cfg.data.workers.is_auto()) lo.workers = std::min<int64_t>(lo.workers, 1);
  data::Loader train_loader(splits.train, lo);
  data::LoaderOptions eo = lo;
  eo.batch_size = cfg.data.eval_batch_size;
  eo.shuffle = false;
  eo.drop_last = false;
  eo.workers = std::min<int64_t>(lo.workers, 1);
  data::Loader eval_loader(splits.eval, eo);

  auto model = model::build_model(cfg.model, splits.train.sample_shape, cfg.data.num_classes, cfg.run.seed);
  model->to(device);  // before the optimizer takes its parameter list
  auto optimizer = optim::Optimizer::create(cfg.optim, model->named_parameters());
  std::unique_ptr<dist::Comm> comm;
  std::unique_ptr<dist::DataParallel> dp;
  if (distributed) {
    comm = dist::Comm::create(world, {cfg.distributed.backend, cfg.distributed.timeout_s, "", device});
    dp = std::make_unique<dist::DataParallel>(*comm, model->named_parameters(), model->named_buffers(),
                                              static_cast<int64_t>(cfg.distributed.bucket_mb * (1 << 20)), cfg.distributed.overlap,
                                              cfg.distributed.compress);
    dist::Comm* c = comm.get();
    optimizer->set_momentum_reducer([c](torch::Tensor& m, torch::Tensor& e) { dist::onebit_average(*c, m, e); });
  }
  spdlog::info("[model] {}: {} parameters on {}; train {} samples, {} {} samples; {} loader workers{}", model->describe(),
               model->num_parameters(), device.str(), splits.train.count, splits.eval_name, splits.eval.count, lo.workers,
               lo.pin_memory ? " (pinned memory)" : "");

  RunResult result;
  fs::path run_dir;
  std::optional<LoadedCheckpoint> ck;
  std::vector<std::string> warnings;
  if (cfg.checkpoint.resume != "auto" && cfg.checkpoint.resume != "never") {
    ck = CheckpointStore::load_dir(cfg.checkpoint.resume);
    run_dir = ck->dir.parent_path().parent_path();
    result.resumed = true;
  } else {
    bool resuming = false;
    run_dir = choose_run_dir(cfg, &resuming);
    if (resuming) {
      CheckpointStore probe(run_dir / "checkpoints", {});
      ck = probe.load_latest(&warnings);
      for (auto& w : warnings) spdlog::warn("[checkpoint] {}", w);
      if (!ck && !warnings.empty())
        throw CheckpointError((run_dir / "checkpoints").string(), "no intact checkpoint to resume from",
                              "delete the folder or set checkpoint.resume=never to start over");
      result.resumed = ck.has_value();
    }
  }
  // Every rank chose the same folder from the same file system state; only then may rank 0 create it.
  if (comm) comm->barrier("barrier(run folder chosen)");
  const bool writer = world.rank == 0;
  result.run_dir = run_dir;
  result.rank = world.rank;
  if (writer) {
    fs::create_directories(run_dir);
    if (!result.resumed || !fs::exists(run_dir / "config.yaml"))
      write_file_atomic((run_dir / "config.yaml").string(), config::to_yaml(cfg));
    write_file_atomic((run_dir / "env.json").string(), env_json(cfg, opt).dump(2) + "\n");
  }
  spdlog::info("[run] {} {}", result.resumed ? "resuming in" : "writing to", run_dir.string());
  spdlog::info("[runtime] {}", runtime::describe().dump());
  if (const char* job = std::getenv("SLURM_JOB_ID"))
    spdlog::info("[slurm] job {} restart count {}", job, std::getenv("SLURM_RESTART_COUNT") ? std::getenv("SLURM_RESTART_COUNT") : "0 (first run)");

  Trainer trainer(cfg, *model, *optimizer, train_loader, eval_loader);
  auto augmenter = std::make_shared<data::Augmenter>(cfg.data.augment, static_cast<uint64_t>(cfg.run.seed));
  if (augmenter->any_sample_op() || augmenter->any_batch_op())
    train_loader.set_augmenter(augmenter, trainer.total_steps() * trainer.accumulate());
  CheckpointStore store(run_dir / "checkpoints",
                        {cfg.checkpoint.keep_last, cfg.checkpoint.keep_best, cfg.checkpoint.mode == "max"});
  if (ck) {
    restore_checkpoint(*ck, trainer);
    spdlog::info("[checkpoint] restored {} (step {}, epoch {}, batch {})", ck->dir.string(), ck->step,
                 trainer.progress().epoch, trainer.progress().batch_in_epoch);
  }
  if (dp) {
    dp->broadcast_initial();  // rank 0's weights and buffers (restored or fresh) everywhere
    trainer.set_distributed(comm.get(), dp.get());
  }
  if (auto hooks = std::make_unique<TestHooks>(*model, world.rank); hooks->active()) trainer.add_observer(std::move(hooks));
  if (writer) {  // rank 0 alone writes metrics, checkpoints and the console log
    trainer.add_observer(std::make_unique<MetricsWriter>(run_dir, cfg.train.tensorboard, opt.jsonl_stdout));
    trainer.add_observer(std::make_unique<ConsoleReporter>(opt.tty));
    trainer.add_observer(std::make_unique<CheckpointWriter>(store));
  }

  install_stop_handlers();
  if (writer) write_status(run_dir, "running", trainer.progress().step);
  try {
    trainer.fit();
  } catch (const Interrupted& e) {
    if (writer) write_status(run_dir, "interrupted", trainer.progress().step, e.what());
    // Under `mltrain slurm`'s batch script: the checkpoint is written, so put the job back in the
    // queue (it resumes from that checkpoint), up to max_requeues times.
    const char* job = std::getenv("SLURM_JOB_ID");
    if (writer && job && std::getenv("MLTRAIN_SLURM_REQUEUE")) {
      const char* rc = std::getenv("SLURM_RESTART_COUNT");
      const int64_t restarts = rc ? std::atoll(rc) : 0;
      if (restarts < cfg.distributed.max_requeues) {
        spdlog::warn("[slurm] checkpoint saved at step {}; requeueing job {} (restart {} of at most {})", trainer.progress().step, job,
                     restarts + 1, cfg.distributed.max_requeues);
        const std::string cmd = std::string("scontrol requeue ") + job;
        if (std::system(cmd.c_str()) != 0) spdlog::error("[slurm] `{}` failed; resubmit the job to resume", cmd);
      } else {
        spdlog::warn("[slurm] job {} already requeued {} times (distributed.max_requeues): not requeueing", job, restarts);
      }
    }
    throw;
  } catch (const std::exception& e) {
    if (writer) write_status(run_dir, "failed", trainer.progress().step, e.what());
    throw;
  }

  // Final numbers on the test split (the eval split is the test split unless val_fraction > 0).
  EvalResult test;
  if (splits.eval_name == "test" && trainer.last_eval()) {
    test = *trainer.last_eval();
  } else {
    data::LoaderOptions to = eo;
    data::Loader test_loader(splits.test, to);
    test = trainer.evaluate(test_loader);
  }
  result.steps = trainer.progress().step;
  result.test_accuracy = test.accuracy;
  result.test_loss = test.loss;
  result.train_seconds = trainer.progress().train_seconds;
  result.time_to_target = trainer.progress().time_to_target;
  nlohmann::json summary = {{"event", "summary"},      {"step", result.steps},
                            {"test_accuracy", test.accuracy}, {"test_loss", test.loss},
                            {"train_seconds", result.train_seconds}};
  if (result.time_to_target) summary["time_to_target_s"] = *result.time_to_target;
  if (dp) {
    summary["world_size"] = world.size;
    summary["allreduce_wait_s"] = dp->comm_wait_seconds();
    summary["allreduce_bytes"] = comm->bytes_sent();
    spdlog::info("[dist] gradient all-reduce: {:.2f} s exposed of {:.2f} s training ({:.1f} %), {} buckets, overlap {}", dp->comm_wait_seconds(),
                 result.train_seconds, 100 * dp->comm_wait_seconds() / std::max(1e-9, result.train_seconds), dp->buckets(),
                 cfg.distributed.overlap ? "on" : "off");
  }
  if (!writer) return result;
  {
    std::ofstream out(run_dir / "metrics.jsonl", std::ios::app);
    out << summary.dump() << "\n";
  }
  if (opt.jsonl_stdout) std::cout << summary.dump() << std::endl;
  write_status(run_dir, "finished", result.steps);
  return result;
}

}  // namespace mltrain::train
