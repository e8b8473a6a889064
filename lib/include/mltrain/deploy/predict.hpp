#pragma once
// Using a trained run: `mltrain evaluate` scores its weights on any split or data set with the
// task's metrics; `mltrain predict` applies them to new inputs. Both rebuild the run through
// train::restore_run, so they read data and evaluate exactly as the run did.
//
//   auto r = deploy::evaluate_run({.where = "runs/cnn/v0", .overrides = {"data.test_images=x/"}});
//   r.metrics.at("accuracy");
//   deploy::predict_run({.where = "runs/cnn/v0", .inputs = {"photos/"}, .out = "preds.csv"});
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mltrain::deploy {

struct UseOptions {
  std::string where;                   // run folder or checkpoint folder
  std::vector<std::string> overrides;  // key=value on the run's config.yaml
  bool best = false;                   // the kept checkpoint with the best monitored metric
  bool last = false;                   // the latest intact checkpoint (the default; --last)
  bool ema = false;                    // the EMA weights (ema.enabled runs)
};

struct EvaluateOptions : UseOptions {
  std::string split = "test";  // test | val | train
  std::string out;             // JSON report; empty: <run>/evaluation_<split>.json
};
struct EvaluateReport {
  std::string run, checkpoint, split, task, weights;
  int64_t step = 0, samples = 0;
  double seconds = 0;
  std::map<std::string, double> metrics;  // the task's metrics, as eval_<name> in training
  nlohmann::json to_json() const;
  std::string to_text() const;
};
EvaluateReport evaluate_run(const EvaluateOptions& opt);

struct PredictOptions : UseOptions {
  std::vector<std::string> inputs;
  std::string out;           // .csv, .jsonl; empty or "-": JSON lines on stdout
  int64_t top_k = 0;         // classification: the k best classes only (0: every class)
  int64_t generate = 0;      // language models: tokens to sample after each input
  double temperature = 1.0;  // 0: greedy
  int64_t sample_top_k = 0;  // sample among the k likeliest tokens (0: all)
  uint64_t seed = 0;
};
struct PredictReport {
  int64_t samples = 0;
  std::string out;
  double seconds = 0;
};
PredictReport predict_run(const PredictOptions& opt);

}  // namespace mltrain::deploy
