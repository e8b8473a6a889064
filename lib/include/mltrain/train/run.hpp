#pragma once
// The engine entry point behind `mltrain train`: config in, a finished (or cleanly interrupted)
// run directory out.
//
//   auto cfg = config::load_experiment(path, overrides);
//   RunResult r = run_training(cfg, {.config_path = path});
//   // runs/<name>/v<N>/{config.yaml, env.json, metrics.jsonl, metrics.csv, status.json, checkpoints/}
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"

namespace mltrain::train {

struct RunOptions {
  std::string config_path;
  std::vector<std::string> command_line;
  bool tty = false;  // progress bar instead of log lines
  bool jsonl_stdout =
      false;  // eval records and the summary as JSON lines on stdout (for `mltrain tune`)
};

struct RunResult {
  std::filesystem::path run_dir;
  int64_t steps = 0;
  double test_accuracy = 0, test_loss = 0;     // accuracy: NaN for tasks without one
  std::map<std::string, double> test_metrics;  // every metric of the task on the test split
  double train_seconds = 0;
  std::optional<double> time_to_target;
  bool resumed = false;
  int rank = 0;  // distributed: only rank 0 wrote anything
};

RunResult run_training(const config::ExperimentConfig& cfg, const RunOptions& opt);

// runs/<name>/v<N>: the newest unfinished version when resume is auto and it has a checkpoint,
// else a new version.
std::filesystem::path choose_run_dir(const config::ExperimentConfig& cfg, bool* resuming);

}  // namespace mltrain::train
