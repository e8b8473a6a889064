#pragma once
// `mltrain tune`: a study is a folder holding study.yaml (the resolved settings), journal.jsonl
// (the append-only record of every trial, shared by every driver process through flock) and, per
// trial, a run folder and log. Rerunning the same command resumes: finished trials are kept,
// trials whose driver is gone become FAIL ("stale") and are retried up to max_retry.
//
//   auto cfg = load_study_config("configs/tune/branin.yaml", {"sampler.name=gp"});
//   auto summary = run_study(cfg, {.self_exe = "/proc/self/exe"});
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "mltrain/config/study.hpp"
#include "mltrain/tune/pruner.hpp"
#include "mltrain/tune/sampler.hpp"
#include "mltrain/tune/space.hpp"

namespace mltrain::tune {

struct StudyConfig {
  std::string source;  // the YAML file
  std::string name = "study";
  std::string dir = "runs/tune";
  uint64_t seed = 0;
  int n_trials = 20;
  double timeout_s = 0;  // stop starting trials after this long (0: none)
  int max_concurrent = 1;
  int max_retry = 1;
  double heartbeat_s = 2;
  double stale_after_s =
      30;  // a RUNNING trial whose driver was silent this long (or is dead on this host) is stale
  SamplerOptions sampler;
  PrunerOptions pruner;
  std::string metric = "accuracy";  // the first objective (the one pruners judge)
  bool maximize = true;
  struct Objective {
    std::string metric;
    bool maximize = true;
  };
  std::vector<Objective> objectives;  // every objective, the first being metric/maximize
  bool multi() const { return objectives.size() > 1; }
  int folds = 0;                       // > 1: each trial is a group of fold trainings
  std::string function;                // builtin test function (in-process; no trial processes)
  std::string train_config;            // trials run `mltrain train` on this config ...
  std::vector<std::string> overrides;  // ... with these overrides before the sampled ones
  std::vector<std::string>
      command;      // ... or this command (params as --name=value and MLTRAIN_PARAM_*)
  int threads = 0;  // per trial (0: cores / max_concurrent)
  Space space;
  config::StudyFile file;  // the resolved study, as <study dir>/study.yaml holds it
  std::filesystem::path study_dir() const { return std::filesystem::path(dir) / name; }
};

// The study file read through its schema (config/study.hpp): every problem (unknown keys, bad
// ranges, a missing objective, a sampler the space does not fit) in one ConfigError, each with
// file:line:col.
StudyConfig load_study_config(const std::string& path, const std::vector<std::string>& overrides);

struct RunStudyOptions {
  std::string self_exe;  // the mltrain binary, for `trial.train`
  bool quiet = false;    // no per-trial log lines
};

// Runs (or resumes) the study until n_trials trials are finished, the timeout passes or the grid
// is exhausted; writes the outputs (see analysis.hpp) and returns the summary.
nlohmann::json run_study(const StudyConfig& cfg, const RunStudyOptions& opt);

// The replayed journal: one entry per trial.
struct TrialState {
  int number = -1;
  nlohmann::json params;
  std::vector<double> x;
  std::string state = "RUNNING";  // RUNNING | COMPLETE | PRUNED | FAIL
  double value = NAN;             // as reported (not negated)
  std::vector<double> values;     // several objectives: each as reported (value = values[0])
  std::vector<std::pair<int64_t, double>> intermediate;  // (step, value) as reported
  std::string reason, worker;
  int retry_of = -1;
  double started = 0, finished = 0;
  nlohmann::json attrs = nlohmann::json::object();
};
std::vector<TrialState> read_trials(const std::filesystem::path& study_dir, const Space& space);

}  // namespace mltrain::tune
