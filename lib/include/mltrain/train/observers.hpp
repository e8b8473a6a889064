#pragma once
// Observers the `train` command attaches to the Trainer.
//   MetricsWriter     metrics.jsonl + metrics.csv (one record per log period and per evaluation)
//   ConsoleReporter   a progress bar on a terminal; a log line per period when piped / under Slurm
//   CheckpointWriter  periodic, final and on-signal checkpoints through CheckpointStore
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "mltrain/train/checkpoint.hpp"
#include "mltrain/formats/tensorboard.hpp"
#include "mltrain/train/trainer.hpp"

namespace mltrain::train {

// Window accumulator shared by the writers.
struct Window {
  double loss = 0, step_s = 0, data_s = 0, grad_norm = 0, grad_norm_max = 0;
  int64_t correct = 0, count = 0, units = 0, steps = 0;
  void add(const StepInfo& s) {
    loss += s.loss;
    correct += s.correct;
    count += s.count;
    units += s.units;
    steps += 1;
    step_s += s.step_seconds;
    data_s += s.data_seconds;
    grad_norm += s.grad_norm;
    grad_norm_max = std::max(grad_norm_max, s.grad_norm);
  }
  double accuracy() const { return units > 0 ? double(correct) / units : NAN; }
};

class MetricsWriter : public Observer {
 public:
  // tensorboard: also write each record as scalars "<event>/<field>" into an event file.
  // eval_to_stdout: also print each eval record as a JSON line on stdout (`train --jsonl`).
  explicit MetricsWriter(const std::filesystem::path& run_dir, bool tensorboard = false,
                         bool eval_to_stdout = false);
  void on_step_end(Trainer& t, const StepInfo& s) override;
  void on_eval_end(Trainer& t, const EvalResult& r) override;
  static const char* csv_header();
  // Before a resume from the checkpoint at `step`: drops the records a killed run wrote after it
  // (they are written again) and lines cut by the kill, from metrics.jsonl and metrics.csv, so
  // each step is recorded once. Returns how many metrics.jsonl lines were dropped.
  static int64_t rewind(const std::filesystem::path& run_dir, int64_t step);

 private:
  void write(const nlohmann::json& j);
  std::ofstream jsonl_, csv_;
  std::filesystem::path dir_;  // the run folder, for a failed write's message
  void check_written() const;  // RuntimeError when a record did not reach the disk
  std::unique_ptr<formats::TbWriter> tb_;
  Window w_;
  bool eval_to_stdout_ = false;
};

class ConsoleReporter : public Observer {
 public:
  explicit ConsoleReporter(bool tty);
  void on_train_begin(Trainer& t) override;
  void on_step_end(Trainer& t, const StepInfo& s) override;
  void on_eval_end(Trainer& t, const EvalResult& r) override;
  void on_train_end(Trainer& t) override;

 private:
  bool tty_;
  Window w_;
  double last_draw_ = -1;
};

// Whether checkpoint.every falls on the step just finished (the writer saves then; pipeline
// stages gather their state for it on every rank).
bool checkpoint_due(Trainer& t);

class CheckpointWriter : public Observer {
 public:
  explicit CheckpointWriter(CheckpointStore& store) : store_(store) {}
  void on_step_end(Trainer& t, const StepInfo& s) override;
  void on_stop_request(Trainer& t, int signal) override;
  void on_train_end(Trainer& t) override;
  void save(Trainer& t);

 private:
  CheckpointStore& store_;
  int64_t last_saved_ = -1;
};

// Restores weights, optimizer, RNG and progress from a verified checkpoint folder.
void restore_checkpoint(const LoadedCheckpoint& ck, Trainer& t);

}  // namespace mltrain::train
