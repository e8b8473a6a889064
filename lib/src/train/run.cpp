#include "mltrain/train/run.hpp"
#include "mltrain/train/resume.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <charconv>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>
#include <iostream>

#include "mltrain/config/format.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/core/signals.hpp"
#include "mltrain/dist/heartbeat.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/train/observers.hpp"
#include "mltrain/track/mlflow.hpp"
#include "mltrain/dist/ddp.hpp"
#include "mltrain/dist/world.hpp"
#include "mltrain/train/trainer.hpp"
#include "mltrain/train/pipeline.hpp"
#include "mltrain/dist/slurm.hpp"
#include "mltrain/train/checkpoint.hpp"

#ifndef MLTRAIN_GIT_DESCRIBE
#define MLTRAIN_GIT_DESCRIBE "unknown"
#endif

namespace fs = std::filesystem;

namespace mltrain::train {

fs::path choose_run_dir(const config::ExperimentConfig& cfg, bool* resuming) {
  const fs::path base = fs::path(cfg.run.dir) / cfg.run.name;
  int64_t newest = -1;
  if (fs::exists(base))
    for (const auto& e : fs::directory_iterator(base)) {
      const std::string n = e.path().filename().string();
      int64_t v = -1;  // v<N>; a name too long for int64 is not a version, not a throw
      if (e.is_directory() && n.size() > 1 && n[0] == 'v' &&
          std::from_chars(n.data() + 1, n.data() + n.size(), v).ptr == n.data() + n.size())
        newest = std::max<int64_t>(newest, v);
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
//   MLTRAIN_TEST_SAMPLES=PREFIX       each rank appends "<step> <sample index>..." to PREFIX.<rank>:
//                                     the training samples each step consumed
//   MLTRAIN_TEST_KILL=RANK:STEP       that rank SIGKILLs itself at that step on the first attempt
//                                     (TORCHELASTIC_RESTART_COUNT unset or 0): a real dead worker
//   MLTRAIN_TEST_STALL=RANK:STEP      that rank stops making progress at that step (sleeps until
//                                     killed) on the first attempt: a hung worker, alive but silent
//   MLTRAIN_TEST_HOLD=RANK:STEP       that rank waits at that step on the first attempt until a
//                                     stop signal arrives (the elastic tests: the group is still
//                                     running when a new node comes, however fast it trains)
class TestHooks : public Observer {
 public:
  TestHooks(model::Model& m, int rank) : model_(m), rank_(rank) {
    if (const char* d = std::getenv("MLTRAIN_TEST_PARAM_DIGEST"))
      digest_ = std::string(d) + "." + std::to_string(rank);
    if (const char* d = std::getenv("MLTRAIN_TEST_SAMPLES"))
      samples_ = std::string(d) + "." + std::to_string(rank);
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const bool first_attempt = !restart || std::string(restart) == "0";
    if (const char* k = std::getenv("MLTRAIN_TEST_KILL"); k && first_attempt)
      std::sscanf(k, "%d:%ld", &kill_rank_, &kill_step_);
    if (const char* k = std::getenv("MLTRAIN_TEST_STALL"); k && first_attempt)
      std::sscanf(k, "%d:%ld", &stall_rank_, &stall_step_);
    if (const char* k = std::getenv("MLTRAIN_TEST_HOLD"); k && first_attempt)
      std::sscanf(k, "%d:%ld", &hold_rank_, &hold_step_);
  }
  bool active() const {
    return !digest_.empty() || !samples_.empty() || kill_rank_ >= 0 || stall_rank_ >= 0 ||
           hold_rank_ >= 0;
  }
  void on_train_begin(Trainer& t) override {
    epoch_ = t.progress().epoch, first_ = t.progress().batch_in_epoch;
  }
  void on_step_end(Trainer& t, const StepInfo&) override {
    if (!samples_.empty()) {  // the batches this step consumed, from the loader's own order
      auto& loader = t.train_loader();
      const int64_t end =
          t.progress().epoch != epoch_ ? loader.batches_this_epoch() : t.progress().batch_in_epoch;
      std::ofstream out(samples_, std::ios::app);
      out << t.progress().step;
      for (int64_t b = first_; b < end; ++b)
        for (const int64_t i : loader.batch_samples(b)) out << " " << i;
      out << "\n";
      epoch_ = t.progress().epoch, first_ = t.progress().batch_in_epoch;
    }
    if (!digest_.empty()) {
      uint64_t h = 1469598103934665603ULL;
      for (auto& [n, p] : model_.named_parameters()) {
        const auto c = p.detach().contiguous().cpu();
        const auto* b = static_cast<const unsigned char*>(c.data_ptr());
        for (size_t i = 0, e = size_t(c.numel()) * c.element_size(); i < e; ++i)
          h = (h ^ b[i]) * 1099511628211ULL;
      }
      std::ofstream(digest_, std::ios::app) << t.progress().step << " " << h << "\n";
    }
    if (kill_rank_ == rank_ && t.progress().step == kill_step_) ::raise(SIGKILL);
    if (stall_rank_ == rank_ && t.progress().step == stall_step_)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (hold_rank_ == rank_ && t.progress().step == hold_step_)
      while (!stop_signal()) {  // held on purpose, alive: progress for the doctor
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        dist::here::tick();
      }
  }

 private:
  model::Model& model_;
  int rank_;
  std::string digest_, samples_;
  int64_t epoch_ = 0, first_ = 0;  // MLTRAIN_TEST_SAMPLES: the first batch not yet written
  int kill_rank_ = -1, stall_rank_ = -1, hold_rank_ = -1;
  long kill_step_ = -1, stall_step_ = -1, hold_step_ = -1;
};
}  // namespace

static void write_status(const fs::path& dir, const std::string& state, int64_t step,
                         const std::string& detail = "") {
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
  for (const char* v :
       {"SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT",
        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "RANK", "WORLD_SIZE"})
    if (const char* val = std::getenv(v)) j["env"][v] = val;
  if (std::getenv("KUBERNETES_SERVICE_HOST") && std::getenv("HOSTNAME"))
    j["env"]["KUBERNETES_POD_NAME"] = std::getenv("HOSTNAME");  // a pod's host name is its name
  if (!opt.config_path.empty())
    if (const std::string git = track::git_commit_of(fs::path(opt.config_path).parent_path());
        !git.empty())
      j["config_git"] = git;
  return j;
}

// The run folder: a checkpoint named by checkpoint.resume, or the newest unfinished version of
// this run (resume: auto), or a new version. Every rank decides from the same file system state.
static fs::path resolve_run_dir(const config::ExperimentConfig& cfg,
                                std::optional<LoadedCheckpoint>* ck, bool* resumed) {
  *resumed = false;
  if (cfg.checkpoint.resume != "auto" && cfg.checkpoint.resume != "never") {
    *ck = CheckpointStore::load_dir(cfg.checkpoint.resume);
    *resumed = true;
    return (*ck)->dir.parent_path().parent_path();
  }
  bool resuming = false;
  const fs::path run_dir = choose_run_dir(cfg, &resuming);
  if (resuming) {
    std::vector<std::string> warnings;
    CheckpointStore probe(run_dir / "checkpoints", {});
    *ck = probe.load_latest(&warnings);
    for (auto& w : warnings) spdlog::warn("[checkpoint] {}", w);
    if (!*ck && !warnings.empty())
      throw CheckpointError((run_dir / "checkpoints").string(),
                            "no intact checkpoint to resume from",
                            "delete the folder or set checkpoint.resume=never to start over");
    *resumed = ck->has_value();
  }
  return run_dir;
}

// The test split's evaluation for the summary, as train.final_eval says: the whole split, an evenly
// spaced sample of it, or none. The last in-training evaluation is reused when it was on the test
// split (it cost nothing more). `what` says which, for the log.
static std::optional<EvalResult> final_evaluation(Pipeline& p, std::string* what) {
  Trainer& trainer = *p.trainer;
  const std::string& mode = p.cfg.train.final_eval;
  if (p.splits.eval_name == "test" && trainer.last_eval()) {
    *what = "the last evaluation, on the whole test split";
    return trainer.last_eval();
  }
  if (mode == "none") {
    *what = "none (train.final_eval=none)";
    return std::nullopt;
  }
  const data::Dataset& all = p.splits.test;
  const int64_t n = std::min(all.count, p.cfg.train.final_eval_samples);
  if (mode == "sample" && n < all.count) {
    data::Dataset part;
    if (all.token_windows) {  // windows of one token stream: the first n (gather copies samples)
      part = all.slice(0, n);
    } else {  // evenly spaced: image folders are sorted by class
      std::vector<int64_t> idx(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i * all.count / n;
      part = all.gather(idx);
    }
    *what = fmt::format("{} of the {} test samples (train.final_eval=sample)", n, all.count);
    data::Loader loader(part, p.eval_options);
    return trainer.evaluate(loader);
  }
  *what = fmt::format("the whole test split, {} samples", all.count);
  data::Loader loader(all, p.eval_options);
  return trainer.evaluate(loader);
}

// The summary record: test metrics (see final_evaluation), timing, the evaluations' share of the
// run and, with data parallelism, the all-reduce figures.
static nlohmann::json finish_summary(Pipeline& p, RunResult& result) {
  Trainer& trainer = *p.trainer;
  const double eval_before = trainer.eval_seconds();
  std::string what;
  const std::optional<EvalResult> final_eval = final_evaluation(p, &what);
  const EvalResult test = final_eval.value_or(EvalResult{});
  const double final_s = trainer.eval_seconds() - eval_before;
  const double wall = runtime::seconds_since_exec();
  spdlog::info(
      "[eval] final evaluation: {}, {:.1f} s; evaluations took {:.1f} s of this process's {:.1f} s "
      "({:.0f} %)",
      what, final_s, trainer.eval_seconds(), wall, 100 * trainer.eval_seconds() / wall);
  if (p.cfg.train.final_eval == "full" && final_s > trainer.progress().train_seconds)
    spdlog::warn(
        "[eval] the final evaluation took longer than the training ({:.1f} s against {:.1f} s): "
        "train.final_eval=sample or none shortens short runs",
        final_s, trainer.progress().train_seconds);
  result.steps = trainer.progress().step;
  result.test_accuracy = final_eval ? test.accuracy : NAN;
  result.test_loss = final_eval ? test.loss : NAN;
  result.train_seconds = trainer.progress().train_seconds;
  result.time_to_target = trainer.progress().time_to_target;
  result.test_metrics = test.metrics;
  nlohmann::json summary = {{"event", "summary"},
                            {"step", result.steps},
                            {"task", p.cfg.task.name},
                            {"train_seconds", result.train_seconds},
                            {"final_eval", p.cfg.train.final_eval},
                            {"final_eval_seconds", final_s},
                            {"eval_seconds", trainer.eval_seconds()}};
  if (final_eval) summary["test_samples"] = test.count;
  summary["peak_rss_mib"] = double(runtime::peak_rss_kib()) / 1024.0;  // this rank's (rank 0)
  if (p.cfg.distributed.invariance == "bitwise")
    summary["virtual_shards"] = p.cfg.distributed.virtual_shards;
  if (std::isfinite(trainer.first_step_seconds())) {
    summary["setup_s"] = trainer.fit_start_seconds();
    summary["first_step_s"] = trainer.first_step_seconds();
  }
  for (const auto& [k, v] : test.metrics)
    if (k.rfind("roc_auc_class", 0) != 0) summary["test_" + k] = v;
  if (result.time_to_target) summary["time_to_target_s"] = *result.time_to_target;
  if (const int64_t skipped = p.splits.train.skipped + p.splits.test.skipped; skipped > 0)
    summary["skipped_samples"] = skipped;  // data.on_bad_sample: skip
  if (p.comm) summary["world_size"] = p.world.size;
  if (p.dp) {
    const double wait = p.dp->comm_wait_seconds();
    summary["allreduce_wait_s"] = wait;
    summary["allreduce_bytes"] = p.comm->bytes_sent();
    spdlog::info(
        "[dist] gradient all-reduce: {:.2f} s exposed of {:.2f} s training ({:.1f} %), {} buckets, "
        "overlap {}",
        wait, result.train_seconds, 100 * wait / std::max(1e-9, result.train_seconds),
        p.dp->buckets(), p.cfg.distributed.overlap ? "on" : "off");
  }
  return summary;
}

// The model, the splits and the loader, as the run's first lines say them.
static void log_model(const Pipeline& p) {
  int64_t frozen = 0;
  for (const auto& [name, t] : p.model->named_parameters())
    if (!t.requires_grad()) frozen += t.numel();
  spdlog::info(
      "[model] {}: {} parameters{} on {}; train {} samples, {} {} samples; {} loader workers{}",
      p.model->describe(), p.model->num_parameters(),
      frozen ? fmt::format(" ({} frozen, {} trainable)", frozen, p.model->num_parameters() - frozen)
             : std::string(),
      p.device.str(), p.splits.train.count, p.splits.eval_name, p.splits.eval.count,
      p.train_loader->options().workers,
      p.train_loader->options().pin_memory ? " (pinned memory)" : "");
}

RunResult run_training(const config::ExperimentConfig& cfg, const RunOptions& opt) {
  const dist::World world = dist::world_from_env();
  if (world.size > 1 && world.rank != 0)
    spdlog::set_level(spdlog::level::warn);  // rank 0 alone logs to the console
  // Data, model, optimizer and the step plan first: bad input fails before any run folder exists.
  std::optional<track::MlflowTarget> mlflow_target = track::mlflow_target(cfg.tracking.mlflow, "");
  const auto p = build_pipeline(cfg, world);
  Trainer& trainer = *p->trainer;
  log_model(*p);

  RunResult result;
  std::optional<LoadedCheckpoint> ck;
  fs::path run_dir = resolve_run_dir(cfg, &ck, &result.resumed);
  if (p->comm && cfg.checkpoint.resume == "auto") {
    // Node-local disks see different folders and checkpoints: rank 0's folder, and the newest
    // step any rank holds, sent to the ranks without it (resume.hpp).
    run_dir = agree_run_dir(*p->comm, cfg, run_dir);
    std::vector<std::string> warnings;
    ck = CheckpointStore(run_dir / "checkpoints", {}).load_latest(&warnings);
    for (auto& w : warnings) spdlog::warn("[checkpoint] {}", w);
    ck = agree_on_resume(*p->comm, run_dir, ck);
    result.resumed = ck.has_value();
  }
  // Every rank chose the same folder; only then may rank 0 create it.
  if (p->comm) p->comm->barrier("barrier(run folder chosen)");
  const bool writer = world.rank == 0;
  // checkpoint.node_local: every node keeps its own copy of each checkpoint.
  const bool checkpoints_here = writer || (cfg.checkpoint.node_local && world.local_rank == 0);
  result.run_dir = run_dir;
  result.rank = world.rank;
  if (checkpoints_here && !writer) {
    fs::create_directories(run_dir);
    CheckpointStore::remove_leftovers(run_dir);
  }
  if (writer) {
    fs::create_directories(run_dir);
    for (const auto& left : CheckpointStore::remove_leftovers(run_dir))
      spdlog::info("[run] removed {} (left by a killed run)", left.string());
    if (!result.resumed || !fs::exists(run_dir / "config.yaml"))
      write_file_atomic((run_dir / "config.yaml").string(), config::to_yaml(cfg));
    write_file_atomic((run_dir / "env.json").string(), env_json(cfg, opt).dump(2) + "\n");
  }
  spdlog::info("[run] {} {}", result.resumed ? "resuming in" : "writing to", run_dir.string());
  spdlog::info("[runtime] {}", runtime::describe().dump());
  if (const char* job = std::getenv("SLURM_JOB_ID"))
    spdlog::info(
        "[slurm] job {} restart count {}", job,
        std::getenv("SLURM_RESTART_COUNT") ? std::getenv("SLURM_RESTART_COUNT") : "0 (first run)");

  CheckpointStore store(
      run_dir / "checkpoints",
      {cfg.checkpoint.keep_last, cfg.checkpoint.keep_best, config::checkpoint_mode(cfg) == "max"});
  if (ck) {
    restore_checkpoint(*ck, trainer);
    spdlog::info("[checkpoint] restored {} (step {}, epoch {}, batch {})", ck->dir.string(),
                 ck->step, trainer.progress().epoch, trainer.progress().batch_in_epoch);
    trainer.start_rewarm(trainer.optimizer().steps());
  }
  if (p->dp)
    p->dp->broadcast_initial();  // rank 0's weights and buffers (restored or fresh) everywhere
  if (auto hooks = std::make_unique<TestHooks>(*p->model, world.rank); hooks->active())
    trainer.add_observer(std::move(hooks));
  // Pipeline stages hand their state to rank 0 before it writes a checkpoint.
  if (p->stages) trainer.add_observer(std::make_unique<StageGather>(*p->stages));
  if (writer) {  // rank 0 alone writes metrics, checkpoints and the console log
    // Resumed from step k, or restarted in the folder of a run killed before its first
    // checkpoint (step 0): what that run recorded after the step is redone, so it goes.
    const int64_t from = ck ? ck->step : 0;
    if (ck || fs::exists(run_dir / "metrics.jsonl"))
      if (const int64_t n = MetricsWriter::rewind(run_dir, from); n > 0)
        spdlog::info("[metrics] dropped {} record(s) written after step {} (redone now)", n, from);
    trainer.add_observer(
        std::make_unique<MetricsWriter>(run_dir, cfg.train.tensorboard, opt.jsonl_stdout));
    trainer.add_observer(std::make_unique<ConsoleReporter>(opt.tty));
  }
  if (checkpoints_here) trainer.add_observer(std::make_unique<CheckpointWriter>(store));
  // MLflow: rank 0 streams metrics.jsonl from a thread of its own (track/mlflow.hpp).
  std::unique_ptr<track::RunSync> mlflow;
  if (writer && mlflow_target) {
    track::SyncOptions so = track::options_for_run(run_dir, *mlflow_target);
    so.resume_step = ck ? ck->step : -1;
    so.config_yaml = config::to_yaml(cfg);
    mlflow = std::make_unique<track::RunSync>(so);
    mlflow->start();
    spdlog::info("[mlflow] sending records to {} (experiment '{}')", so.target.uri,
                 so.target.experiment);
  }

  install_stop_handlers();
  if (writer) write_status(run_dir, "running", trainer.progress().step);
  try {
    trainer.fit();
  } catch (const Interrupted& e) {
    if (writer) {
      write_status(run_dir, "interrupted", trainer.progress().step, e.what());
      // Under `mltrain slurm`'s batch script the checkpoint is written: back into the queue.
      if (const std::string requeue =
              dist::requeue_after_checkpoint(cfg.distributed.max_requeues, trainer.progress().step);
          !requeue.empty())
        write_status(run_dir, "interrupted", trainer.progress().step,
                     std::string(e.what()) + "; " + requeue);
    }
    // A preempted job has seconds: what is not sent now is sent by the resume.
    if (mlflow) mlflow->finish("interrupted", std::min(5.0, mlflow_target->flush_seconds));
    throw;
  } catch (const std::exception& e) {
    // Best effort: on a full disk or a read-only folder the status cannot be written either, and
    // the error the user needs is the first one.
    if (writer) try {
        write_status(run_dir, "failed", trainer.progress().step, e.what());
      } catch (const std::exception& also) {
        spdlog::warn("[run] status.json not updated: {}", also.what());
      }
    if (mlflow) mlflow->finish("failed");
    throw;
  }

  const nlohmann::json summary = finish_summary(*p, result);
  if (!writer) return result;
  {
    std::ofstream out(run_dir / "metrics.jsonl", std::ios::app);
    out << summary.dump() << "\n";
  }
  if (opt.jsonl_stdout) std::cout << summary.dump() << std::endl;
  write_status(run_dir, "finished", result.steps);
  if (mlflow) mlflow->finish("finished");
  return result;
}

}  // namespace mltrain::train
