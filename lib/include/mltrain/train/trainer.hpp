#pragma once
// The training loop: one flat function (Trainer::fit) you can read top to bottom. Per-step
// techniques (accumulation, autocast, loss scaling, clipping, gradient health, EMA, label
// smoothing) are small components it calls in order; everything else — metrics files, progress,
// checkpoints, early stopping — hangs off Observer hooks.
//
//   auto p = build_pipeline(cfg, world);      // pipeline.hpp: the Trainer comes planned for its world
//   p->trainer->add_observer(std::make_unique<MetricsWriter>(run_dir));
//   p->trainer->fit();                                 // throws Interrupted after a clean checkpoint on SIGTERM
#include <torch/torch.h>

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/core/phase.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/optim/schedule.hpp"
#include "mltrain/task/task.hpp"
#include "mltrain/train/techniques.hpp"

namespace mltrain::dist {
class Comm;
class DataParallel;
}  // namespace mltrain::dist

namespace mltrain::train {

struct Progress {
  int64_t step = 0;            // optimizer-step attempts done (skipped ones included)
  int64_t epoch = 0;           // epoch the next batch belongs to
  int64_t batch_in_epoch = 0;  // next batch within that epoch (after epoch_skip)
  int64_t epoch_skip = 0;      // global samples of this epoch consumed in a world of another size
                               // before a resume (data::epoch_order's skip); 0 otherwise
  double train_seconds = 0;    // wall time spent in fit(), summed over resumes
  double lr_scale = 1.0;       // lowered by gradient-health rollbacks
  int64_t skipped_steps = 0;   // steps whose update was skipped (inf/nan, skip_step, rollback)
  std::optional<double> time_to_target;
};

struct StepInfo {
  double loss = 0;
  int64_t correct = 0, count = 0;  // count: samples
  int64_t units = 0;               // what `correct` counts (samples, tokens); 0: not counted
  double lr = 0;
  double step_seconds = 0, data_seconds = 0;
  double grad_norm = 0;  // before clipping
  double label_smoothing = 0;
  double loss_scale = 0;       // fp16 only
  double grad_underflow = -1;  // fp16: sampled share of gradient elements lost at this scale
  int64_t micro_batch = 0;     // samples per forward/backward this step
  bool skipped = false;
};

struct EvalResult {
  double loss = 0, accuracy = NAN;  // accuracy: classification and language models only
  task::Metrics metrics;            // every metric of the task, without the eval_ prefix
  int64_t count = 0;
  double seconds = 0;
  // A metric by its global name ("eval_loss", "eval_r2"); ConfigError naming `key` if the task
  // does not report it (custom tasks report what their model returns).
  double metric(const std::string& name, const std::string& key) const;
};

class Trainer;
class PipelineStages;
class InvariantShards;

// Where a training step's wall time goes (`mltrain profile`): a sum per step phase
// (core/phase.hpp). Each mark charges the time since the last one to the phase being left, so
// every moment of a step is counted once; phases outside a step are charged to kOther. On CUDA
// the clock can synchronise first, so each phase is charged with its own kernels (that
// synchronisation is part of the profiler's overhead).
struct PhaseClock {
  bool sync_cuda = false;
  std::array<double, kStepPhases> seconds{};
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  Phase current = Phase::kOther;
  void enter(Phase p);  // charge the current phase up to now, then be in p
  void charge() { enter(current); }
  double total() const;
};

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on_train_begin(Trainer&) {}
  virtual void on_step_end(Trainer&, const StepInfo&) {}
  virtual void on_eval_end(Trainer&, const EvalResult&) {}
  virtual void on_stop_request(Trainer&, int /*signal*/) {}  // before fit() throws Interrupted
  virtual void on_train_end(Trainer&) {}
};

// Micro-batches per optimizer step after resolving train.accumulate / train.global_batch.
int64_t resolve_accumulate(const config::ExperimentConfig& cfg, int64_t world);

// The step layout of a run: optimizer steps per epoch, total steps, and the LR schedule with
// train.lr_scaling applied. The Trainer and `mltrain schedule` both use it, so they cannot differ.
struct StepPlan {
  int64_t accumulate = 1, steps_per_epoch = 0, total_steps = 0;
  std::unique_ptr<optim::Schedule> lr;
};
// total_steps >= 0 replaces the duration's count (a run re-planned after a resume in another world).
StepPlan plan_steps(const config::ExperimentConfig& cfg, int64_t batches_per_epoch, int64_t world,
                    int64_t total_steps = -1);

// Data parallel over comm (world > 1): steps are planned for the world size (global batch, LR
// scaling), gradients sync through dp, evaluation metrics are summed over ranks and stop signals
// agreed, so every rank takes the same decisions at the same step.
// With pipeline stages (distributed.pipeline), `dp` is the stage's data-parallel group over its
// replicas, the world of the step plan is the replicas, and each batch runs through `pipe`.
struct Distributed {
  dist::Comm* comm = nullptr;
  dist::DataParallel* dp = nullptr;
  PipelineStages* pipe = nullptr;
};

class Trainer {
 public:
  // Built by train::build_pipeline (pipeline.hpp), which owns everything it refers to.
  Trainer(const config::ExperimentConfig& cfg, model::Model& model, optim::Optimizer& opt,
          data::Loader& train, data::Loader& eval, Distributed distributed = {});
  ~Trainer();
  void add_observer(std::unique_ptr<Observer> o) { observers_.push_back(std::move(o)); }
  void set_phase_clock(PhaseClock* clock) { phases_ = clock; }
  // The one phase marker: the phase clock (when profiling) and the hang doctor's heartbeat.
  void enter(Phase p) const;
  // memory.micro_batch resolved: each loader batch runs as micro-batches of `samples` (0: whole).
  // `recover`: an out-of-memory error halves it and redoes the batch (data.batch_size=auto, one
  // rank: the loader batch is the whole optimizer step, so nothing is half-applied).
  void set_micro_batch(int64_t samples, bool recover);
  int64_t micro_batch() const { return micro_; }
  int64_t oom_events() const { return oom_events_; }
  void fit();
  EvalResult evaluate(data::Loader& loader);  // with the EMA weights when ema.evaluate
  // Every batch of `loader` through the task's forward in evaluation mode, with the weights
  // evaluate() uses: `sink` gets each batch's fp32 output (shaped for the task) on the CPU.
  void predict(data::Loader& loader, const std::function<void(const torch::Tensor&)>& sink);
  // fn(model) in evaluation mode, without gradients, with the weights evaluate() uses.
  void with_eval_weights(const std::function<void(model::Model&)>& fn);

  const config::ExperimentConfig& cfg() const { return cfg_; }
  model::Model& model() { return model_; }
  optim::Optimizer& optimizer() { return opt_; }
  Progress& progress() { return progress_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t total_steps() const { return total_steps_; }
  // Whether train.log_every logs the step (the last step always, unless logging is off).
  bool logs_step(int64_t step) const;
  int64_t accumulate() const { return accumulate_; }
  double lr_at(int64_t optimizer_step) const {
    return schedule_->lr(optimizer_step) * progress_.lr_scale * rewarm_factor(optimizer_step);
  }
  int64_t world() const;  // ranks training together (1 without a process group)
  // A resume from a checkpoint written by `old_world` ranks of `old_batch` samples each, in the
  // middle of an epoch: the samples consumed so far become the epoch's skip, the rest of the
  // epoch is re-sharded over this world, and an epoch-long run's total steps and schedules are
  // re-planned so that it still ends where its duration says.
  void reshard(int64_t old_world, int64_t old_batch);
  // distributed.rewarm: the learning rate ramps from 0 back to the schedule's over that period,
  // starting at `optimizer_step` (the resume).
  void start_rewarm(int64_t optimizer_step);
  optim::Schedule& schedule() { return *schedule_; }
  std::optional<EvalResult> last_eval() const { return last_eval_; }
  double eval_seconds() const { return eval_seconds_; }  // every evaluate() of this process
  // Seconds from this process's exec to the start of fit() (set-up: libraries, data, model,
  // checkpoint) and to the end of its first optimizer step (NaN before them).
  double fit_start_seconds() const { return fit_start_s_; }
  double first_step_seconds() const { return first_step_s_; }
  double data_wait_seconds() const { return train_.wait_seconds(); }
  data::Loader& train_loader() { return train_; }
  const torch::Device& device() const { return device_; }
  const task::Task& task() const { return *task_; }
  const std::string& stop_reason() const { return stop_reason_; }
  void request_stop(std::string reason) { stop_reason_ = std::move(reason); }

  // Technique state for checkpoints: JSON in trainer.json, tensors (EMA) in state.safetensors.
  nlohmann::json technique_state() const;
  void load_technique_state(const nlohmann::json& j);
  model::NamedTensors technique_tensors() const;
  void load_technique_tensors(const std::map<std::string, torch::Tensor>& t);

 private:
  bool handle_unhealthy(GradHealth::Verdict v, const model::NamedTensors& params, double norm);
  void to_device(data::Batch& b) const;
  task::Amp amp() const;
  // in_step: the training loop's batch (marks its host-to-device copy as a phase).
  bool next_on_device(data::Loader& loader, data::Batch& b, compat::CopyFence& fence,
                      bool in_step = false) const;
  struct BatchSums {
    double loss = 0;  // sum of per-sample losses
    int64_t correct = 0, units = 0;
    bool counted = false;
    // Without pipeline stages the sums stay on the device (double loss, int64 hits) until the
    // optimizer step reads them with the gradient norm: one host sync per step, not two per
    // micro-batch and one more for the norm.
    torch::Tensor loss_t, correct_t;
  };
  BatchSums forward_backward(const data::Batch& batch, double eps, double full_window,
                             bool final_micro);
  BatchSums forward_backward_once(const data::Batch& batch, double eps, double full_window,
                                  bool final_micro);
  void take_snapshot();
  bool optimizer_step(const model::NamedTensors& params, int64_t window_samples, double full_window,
                      double lr, StepInfo& info, BatchSums& pending);
  void evaluate_during_fit(double train_loss, double seconds_before,
                           std::chrono::steady_clock::time_point fit_start);
  void check_stop_signal();
  void advance_progress(int64_t last_batch_index, int64_t batches_per_epoch);
  bool underflow_due() const;  // fp16: sample the underflow share at this update
  static void add_sums(BatchSums& window, const BatchSums& b);
  static double read_step_sums(const model::NamedTensors& params, BatchSums& window);
  double rewarm_factor(int64_t optimizer_step) const;
  void replan(int64_t total_steps);

  const config::ExperimentConfig& cfg_;
  torch::Device device_ = torch::kCPU;  // where the model's parameters live
  model::Model& model_;
  optim::Optimizer& opt_;
  std::unique_ptr<task::Task> task_;
  data::Loader& train_;
  data::Loader& eval_;
  std::vector<std::unique_ptr<Observer>> observers_;
  PhaseClock* phases_ = nullptr;
  dist::Comm* comm_ = nullptr;
  dist::DataParallel* dp_ = nullptr;
  PipelineStages* pipe_ = nullptr;
  Progress progress_;
  int64_t steps_per_epoch_ = 0, total_steps_ = 0, accumulate_ = 1;
  int64_t rewarm_from_ = -1, rewarm_steps_ = 0;  // distributed.rewarm after a resume
  std::optional<EvalResult> last_eval_;
  double eval_seconds_ = 0, fit_start_s_ = NAN, first_step_s_ = NAN;
  std::unique_ptr<optim::Schedule> schedule_, smoothing_;
  std::optional<LossScaler> scaler_;
  GradClipper clipper_;
  GradHealth health_;
  std::unique_ptr<Ema> ema_;
  std::unique_ptr<InvariantShards> invariant_;  // distributed.invariance: bitwise
  EarlyStopping early_;
  std::deque<Snapshot> snapshots_;
  std::string stop_reason_, failure_;
  int64_t micro_ = 0, oom_events_ = 0;
  bool oom_recover_ = false, underflow_warned_ = false;
  int64_t since_eval_correct_ = 0,
          since_eval_count_ = 0;  // train accuracy for adaptive augmentation
};

}  // namespace mltrain::train
