#pragma once
// One trial of a cross-validated study (`objective.folds: K`): K fold trainings as child
// processes, run at once, whose reports are averaged. The study driver runs this as the trial's
// process (`mltrain tune folds ...`), so a pruned trial's process group, every fold included,
// stops together, judged on the running fold mean.
//
// Stdout (JSON lines, what the driver reads from any trial):
//   {"step": s, "<metric>": mean over folds, "folds": [...]}   once every fold reported step s
//   {"<metric>": mean of the folds' last values}               when every fold has exited 0
//   {"event": "summary", "folds": {"<metric>": [...], ...}, "<metric>_mean": m, "<metric>_std": sd}
// A fold that fails makes the group fail: the others are stopped, exit status 1 with the fold's
// number and last log line on stderr.
#include <cstdint>
#include <string>
#include <vector>

namespace mltrain::tune {

struct FoldGroupOptions {
  int folds = 3;
  uint64_t seed = 0;                 // the fold permutation's seed (the study's)
  std::vector<std::string> metrics;  // averaged per step and at the end
  std::vector<std::string> argv;     // the trial's command
  // `mltrain train` trials: append data.folds/fold/fold_seed and run.name=<run_name>_f<i>; other
  // commands read MLTRAIN_FOLD, MLTRAIN_FOLDS and MLTRAIN_FOLD_SEED.
  bool train_overrides = false;
  std::string run_name;
  std::string log_dir;  // each fold's stderr: <log_dir>/fold<i>.log ("" : inherited)
};

// Runs the group; returns the exit status for the process.
int run_fold_group(const FoldGroupOptions& o);

// Mean and sample standard deviation (0 for one value).
void mean_std(const std::vector<double>& v, double& mean, double& sd);

}  // namespace mltrain::tune
