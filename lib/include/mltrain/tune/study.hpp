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
  // The resolved study, as <study dir>/study.yaml holds it: every setting of the study file is
  // declared once, in config/study.hpp, and read here through the accessors below.
  config::StudyFile file;
  std::string source;               // the YAML file
  SamplerOptions sampler;           // file.sampler, and what only the tuner sets
  PrunerOptions pruner;             // file.pruner
  std::string metric = "accuracy";  // the first objective (the one pruners judge)
  bool maximize = true;
  struct Objective {
    std::string metric;
    bool maximize = true;
  };
  std::vector<Objective> objectives;  // every objective, the first being metric/maximize
  Space space;

  bool multi() const { return objectives.size() > 1; }
  const std::string& name() const { return file.study.name; }
  const std::string& dir() const { return file.study.dir; }
  uint64_t seed() const { return uint64_t(file.study.seed); }
  int n_trials() const { return int(file.study.n_trials); }
  double timeout_s() const { return file.study.timeout.seconds(); }  // 0: none
  int max_concurrent() const { return int(file.study.max_concurrent); }
  int max_retry() const { return int(file.study.max_retry); }
  double heartbeat_s() const { return file.study.heartbeat_s; }
  // a RUNNING trial whose driver was silent this long (or is dead on this host) is stale
  double stale_after_s() const { return file.study.stale_after_s; }
  int folds() const { return int(file.objective.folds); }  // > 1: each trial is a group of folds
  // builtin test function (in-process; no trial processes)
  const std::string& function() const { return file.objective.function; }
  // trials run `mltrain train` on this config with these overrides before the sampled ones, or
  // this command (params as --name=value and MLTRAIN_PARAM_*)
  const std::string& train_config() const { return file.trial.train; }
  const std::vector<std::string>& overrides() const { return file.trial.overrides; }
  const std::vector<std::string>& command() const { return file.trial.command; }
  int threads() const { return int(file.trial.threads); }  // per trial
  std::filesystem::path study_dir() const { return std::filesystem::path(dir()) / name(); }
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
