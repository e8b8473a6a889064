#pragma once
// Pipeline parallelism (distributed.pipeline): the model cut into S stages at block boundaries,
// one rank per stage, each loader batch sent through them as M micro-batches in a GPipe or 1F1B
// order (dist/pipe_schedule.hpp). Activations go forward and their gradients back with c10d
// send/recv (Gloo; NCCL where built). With world = S x D the D replicas of a stage also form a
// data-parallel group that averages that stage's gradients.
//
// Every rank builds the whole model (the same seed, or the same checkpoint) but computes and
// updates only its stage's units, so the loss and the gradients are those of one process with the
// same global batch. Before an evaluation each stage broadcasts its parameters and buffers to the
// other stages, and before a checkpoint its optimizer state too: every rank then holds the whole
// model, evaluation is sharded over every rank, and a checkpoint is an ordinary one (any world
// and any stage count may resume it).
//
//   PipelineStages pp(cfg, model, world_comm);   // groups; stage = rank % S, replica = rank / S
//   pp.balance(sample_batch, amp);               // measured per-unit time -> stage cut
//   auto sums = pp.run(batch, task, eps, full_window, amp, [&] { dp.begin_backward(true); });
#include <functional>
#include <memory>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/dist/ddp.hpp"
#include "mltrain/dist/pipe_schedule.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/task/task.hpp"
#include "mltrain/train/trainer.hpp"

namespace mltrain::train {

struct StageSums {
  double loss = 0;  // sum of per-sample losses (the last stage's, shared with every stage)
  int64_t correct = 0, units = 0;
  bool counted = false;
};

class StageTail;

class PipelineStages {
 public:
  // Throws ConfigError (distributed.pipeline.stages) when the world is not a multiple of the
  // stages or the model has fewer units than stages. build_pipeline calls it before the ranks
  // form their group: every rank then exits 2 alone, none is left joining a group whose peers
  // have gone (which exited 1, "connection closed by peer", and hid the cause).
  static void check(const config::ExperimentConfig& cfg, const model::Model& model, int64_t world);
  // check(), then the stage's groups.
  PipelineStages(const config::ExperimentConfig& cfg, model::Model& model, dist::Comm& world);
  ~PipelineStages();
  int64_t stages() const { return stages_; }
  int64_t stage() const { return stage_; }
  int64_t replicas() const { return replicas_; }
  int64_t replica() const { return replica_; }
  // This stage in every replica (data parallelism within the stage); null with one replica.
  dist::Comm* replica_group() { return replica_group_.get(); }

  // Times each unit's forward and backward on `sample` (every rank, summed over ranks so the cut
  // is the same everywhere), cuts the units into stages, logs the cut. RNG and buffers restored.
  void balance(const data::Batch& sample, const task::Amp& amp);
  // This stage's parameters and buffers: those its units use (a tied weight is on two stages).
  model::NamedTensors stage_parameters();
  model::NamedTensors stage_buffers();

  // One loader batch: this stage's ops of the schedule; `before_final_backward` runs before the
  // batch's last backward op (data parallelism's gradient hooks). Returns the batch's sums.
  StageSums run(const data::Batch& batch, const task::Task& task, double smoothing,
                double full_window, const task::Amp& amp,
                const std::function<void()>& before_final_backward);
  // A tied weight's gradient summed over the stages that use it (gpt's embedding and output
  // layer), before the optimizer step; its owner and its other users then take the same step.
  void sum_shared_gradients();
  // The gradient norm over every stage: each stage's owned gradients (a tied weight's once).
  double global_norm();
  // Every stage's parameters and buffers to every rank (before an evaluation) and, with an
  // optimizer, its state too (before a checkpoint).
  void gather(optim::Optimizer* opt = nullptr);
  // Measured bubble (idle share of the pipelined passes) against (S-1)/(M+S-1); every rank calls.
  void log_summary();

 private:
  int64_t unit_stage(int64_t unit) const;
  bool uses(const std::string& name, int64_t stage) const;  // a unit of `stage` uses the tensor
  int64_t owner_stage(const std::string& name) const;       // the stage of its unit_of
  std::vector<int64_t> act_shape(int64_t boundary, int64_t rows) const;

  const config::ExperimentConfig& cfg_;
  model::Model& model_;
  dist::Comm& world_;
  std::unique_ptr<dist::Comm> pipe_group_, replica_group_;
  int64_t stages_ = 1, stage_ = 0, replicas_ = 1, replica_ = 0;
  dist::PipeKind kind_;
  std::vector<int64_t> bounds_;                 // stage s: units bounds_[s] .. bounds_[s+1]
  std::vector<std::vector<int64_t>> unit_out_;  // each unit's output shape without the batch
  std::vector<double> unit_seconds_;
  std::vector<torch::Tensor> shared_;  // parameters more than one stage uses
  model::NamedTensors owned_;          // parameters this stage owns (its part of the norm)
  std::unique_ptr<StageTail> tail_;    // the last stage's units as a Model for Task::forward
  double busy_s_ = 0, wall_s_ = 0;
  int64_t batches_ = 0, micro_total_ = 0;
};

// Gathers the stages' state on every rank before the checkpoint writer (rank 0) saves: added on
// every rank, before the writer.
class StageGather : public Observer {
 public:
  explicit StageGather(PipelineStages& p) : p_(p) {}
  void on_step_end(Trainer& t, const StepInfo&) override;
  void on_stop_request(Trainer& t, int) override { p_.gather(&t.optimizer()); }
  void on_train_end(Trainer& t) override { p_.gather(&t.optimizer()); }

 private:
  PipelineStages& p_;
};

}  // namespace mltrain::train
