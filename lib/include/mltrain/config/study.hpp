#pragma once
// The study file of `mltrain tune`, declared once like an experiment (schema.hpp): reading it,
// every problem at once with file:line:col, `mltrain config schema --study` and the resolved
// study.yaml a study folder keeps are visitors over these structs.
//
//   StudyFile s = load_study_file("configs/tune/branin.yaml", {"sampler.name=gp"});
//   std::cout << to_yaml(s);        // what <study dir>/study.yaml holds; reads back to the same bytes
//   std::cout << study_schema_text();
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mltrain/config/schema.hpp"

namespace mltrain::config {

class Issues;

struct StudySettings {
  std::string name = "study";
  std::string dir = "runs/tune";
  int64_t seed = 0;
  int64_t n_trials = 20;
  Duration timeout = Duration::never();
  int64_t max_concurrent = 1;
  int64_t max_retry = 1;
  double heartbeat_s = 2;
  double stale_after_s = 30;
  template <class V>
  void visit(V& v) {
    v.field("name", name, "the study's folder name under dir (and its journal's)",
            Check<std::string>{"non-empty, no '/'", [](const std::string& s) {
                                 return s.empty() || s.find('/') != std::string::npos
                                            ? "must be a non-empty name without '/'"
                                            : "";
                               }});
    v.field("dir", dir, "folder holding studies", any<std::string>());
    v.field("seed", seed, "sampler seed (trial k's parameters are a pure function of it)",
            non_negative<int64_t>());
    v.field("n_trials", n_trials, "trials to finish", positive<int64_t>());
    v.field("timeout", timeout, "stop starting trials after this long");
    v.field("max_concurrent", max_concurrent, "trials run at once by this driver",
            positive<int64_t>());
    v.field("max_retry", max_retry, "retries of a trial whose driver died (stale heartbeat)",
            non_negative<int64_t>());
    v.field("heartbeat_s", heartbeat_s, "seconds between a driver's heartbeats",
            positive<double>());
    v.field("stale_after_s", stale_after_s,
            "a driver silent this many seconds (or dead on this host) owns stale trials",
            positive<double>());
  }
};

struct SamplerSettings {
  std::string name = "tpe";
  int64_t n_startup = 10;
  bool multivariate = true;
  int64_t n_candidates = 32;
  double gamma = 0.1;
  double xi = 0.0;
  std::string pending = "liar";
  template <class V>
  void visit(V& v) {
    v.field("name", name, "sampler", one_of({"grid", "random", "tpe", "gp"}));
    v.field("n_startup", n_startup,
            "random (tpe) or Latin-hypercube (gp) trials before the model is used",
            non_negative<int64_t>());
    v.field("multivariate", multivariate,
            "tpe: one joint Parzen estimator (else one per parameter)");
    v.field("n_candidates", n_candidates, "tpe: candidates drawn from the good trials' estimator",
            positive<int64_t>());
    v.field("gamma", gamma, "tpe: share of trials in the good group",
            Check<double>{"in (0, 1)", [](const double& g) {
                            return g > 0 && g < 1 ? "" : "must be in (0, 1)";
                          }});
    v.field("xi", xi, "gp: expected improvement's exploration offset (standardised units)",
            any<double>());
    v.field("pending", pending,
            "running trials (max_concurrent > 1, several drivers): liar = in the model (tpe: "
            "constant liar in the bad group; gp: kriging believer at the model's mean), "
            "ignore = left out (near-duplicate suggestions)",
            one_of({"liar", "ignore"}));
  }
};

struct PrunerSettings {
  std::string name = "none";
  int64_t n_startup_trials = 5;
  int64_t n_warmup_steps = 0;
  double percentile = 50;
  int64_t min_resource = 1;
  int64_t max_resource = 0;
  int64_t reduction_factor = 3;
  template <class V>
  void visit(V& v) {
    v.field("name", name, "pruner", one_of({"none", "median", "percentile", "asha", "hyperband"}));
    v.field("n_startup_trials", n_startup_trials,
            "median/percentile: trials finished before pruning starts", non_negative<int64_t>());
    v.field("n_warmup_steps", n_warmup_steps,
            "median/percentile: reports of a trial before it can be pruned",
            non_negative<int64_t>());
    v.field("percentile", percentile, "percentile: keep trials above this percentile",
            in_range<double>(0, 100));
    v.field("min_resource", min_resource, "asha/hyperband: reports at the first rung",
            positive<int64_t>());
    v.field("max_resource", max_resource, "hyperband: the largest resource (0: 27 x min_resource)",
            non_negative<int64_t>());
    v.field("reduction_factor", reduction_factor,
            "asha/hyperband: 1/eta of the trials go on at each rung",
            Check<int64_t>{">= 2", [](const int64_t& x) { return x >= 2 ? "" : "must be >= 2"; }});
  }
};

// One of several objectives (a Pareto front).
struct ObjectiveItem {
  std::string metric;
  std::string direction = "maximize";
  template <class V>
  void visit(V& v) {
    v.field("metric", metric, "a reported value (a trial's evaluation field)",
            Check<std::string>{"non-empty", [](const std::string& s) {
                                 return s.empty() ? "must name a metric" : "";
                               }});
    v.field("direction", direction, "maximize or minimize it", one_of({"maximize", "minimize"}));
  }
};

struct ObjectiveSettings {
  std::string metric = "accuracy";
  std::string direction = "maximize";
  std::vector<ObjectiveItem> metrics;
  std::string function;
  int64_t folds = 0;
  template <class V>
  void visit(V& v) {
    v.field("metric", metric, "the reported value to optimise (a trial's evaluation field)",
            any<std::string>());
    v.field("direction", direction, "maximize or minimize the metric",
            one_of({"maximize", "minimize"}));
    v.list("metrics", metrics,
           "several objectives, [{metric, direction}, ...]: the study finds their Pareto front "
           "(tpe: multi-objective TPE; random); `objective: [..]` is short for this");
    v.field("function", function,
            "a built-in test function instead of trials (branin, hartmann6, rosenbrock4, ...)",
            any<std::string>());
    v.field("folds", folds,
            "k-fold cross-validation: each trial trains k folds at once (child processes, "
            "data.folds/data.fold, folds drawn from study.seed) and reports their mean; pruning "
            "judges the running fold mean (0: off)",
            fold_count());
  }
};

struct TrialSettings {
  std::string train;
  std::vector<std::string> overrides;
  std::vector<std::string> command;
  int64_t threads = 0;
  template <class V>
  void visit(V& v) {
    v.field("train", train, "experiment config each trial trains (`mltrain train --jsonl`)",
            any<std::string>());
    v.field("overrides", overrides, "key=value overrides applied before the sampled ones",
            any<std::vector<std::string>>());
    v.field("command", command,
            "or any command: parameters as --name=value and MLTRAIN_PARAM_*, JSON lines out",
            any<std::vector<std::string>>());
    v.field("threads", threads, "threads per trial (0: cores / max_concurrent)",
            non_negative<int64_t>());
  }
};

struct ParamSettings {
  std::string type;
  double low = 0, high = 0;
  bool log = false;
  double step = 0;
  std::vector<Scalar> choices;
  std::vector<double> grid;
  template <class V>
  void visit(V& v) {
    v.field("type", type, "parameter type", one_of({"float", "int", "categorical"}));
    v.field("low", low, "float/int: lower bound", any<double>());
    v.field("high", high, "float/int: upper bound", any<double>());
    v.field("log", log, "float/int: sample on a log scale (low > 0)");
    v.field("step", step, "float: grid step (0: continuous); int: step (0: 1)",
            non_negative<double>());
    v.field("choices", choices, "categorical: the values", any<std::vector<Scalar>>());
    v.field("grid", grid, "float/int: explicit values for the grid sampler",
            any<std::vector<double>>());
  }
};

struct StudyFile {
  StudySettings study;
  SamplerSettings sampler;
  PrunerSettings pruner;
  ObjectiveSettings objective;
  TrialSettings trial;
  std::vector<std::pair<std::string, ParamSettings>> space;
  template <class V>
  void visit(V& v) {
    v.section("study", study, "the study: name, folder, budget, concurrency");
    v.section("sampler", sampler, "how parameters are suggested");
    v.section("pruner", pruner, "how unpromising trials are stopped early");
    v.section("objective", objective, "what is optimised");
    v.section("trial", trial, "what a trial runs");
    v.entries("space", space,
              "parameter name (an experiment key path for trial.train) -> its range");
  }
};

// Extra checks a caller adds to the same report (the tuner: test-function names, the sampler
// against the space), so every problem is listed at once.
using StudyChecks = std::function<void(const StudyFile&, Issues&)>;

// ConfigError (exit 2) listing every problem with file:line:col and a fix. `in_folder`: the
// resolved study.yaml of a study folder (trial.train need not exist any more).
StudyFile load_study_file(const std::string& path, const std::vector<std::string>& overrides,
                          const StudyChecks& extra = nullptr, bool in_folder = false);
std::string to_yaml(const StudyFile& s);
std::string study_schema_text();

}  // namespace mltrain::config
