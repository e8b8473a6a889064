// `mltrain evaluate` and `mltrain predict`: a trained run's weights on other data.
#include <iostream>

#include "commands.hpp"
#include "mltrain/deploy/predict.hpp"

namespace mltrain::cli {

static void add_weights(CLI::App* sub, deploy::UseOptions& o) {
  sub->add_option("run", o.where, "run folder (runs/<name>/v<N>) or a checkpoint folder")
      ->required();
  auto* best =
      sub->add_flag("--best", o.best, "the kept checkpoint with the best monitored metric");
  sub->add_flag("--last", o.last, "the latest intact checkpoint (the default)")->excludes(best);
  sub->add_flag("--ema", o.ema, "the EMA weights (runs trained with ema.enabled)");
}

void setup_evaluate(CLI::App& app, Action& run) {
  auto o = std::make_shared<deploy::EvaluateOptions>();
  auto json = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand(
      "evaluate",
      "score a trained run on a split or another data set with its task's metrics: "
      "mltrain evaluate RUN_DIR [key=value ...] (e.g. data.test_images=other/)");
  add_weights(sub, *o);
  sub->add_option("overrides", o->overrides, "key.path=value on the run's config.yaml");
  sub->add_option("--split", o->split, "which split")
      ->check(CLI::IsMember({"test", "val", "train"}))
      ->capture_default_str();
  sub->add_option("-o,--output", o->out, "JSON report (default: RUN/evaluation_<split>.json)");
  sub->add_flag("--json", *json, "print the JSON report");
  sub->callback([o, json, &run] {
    run = [o, json] {
      const auto r = deploy::evaluate_run(*o);
      std::cout << (*json ? r.to_json().dump(2) + "\n" : r.to_text());
      return 0;
    };
  });
}

void setup_predict(CLI::App& app, Action& run) {
  auto o = std::make_shared<deploy::PredictOptions>();
  auto* sub = app.add_subcommand(
      "predict",
      "apply a trained run to new inputs: mltrain predict RUN_DIR INPUT... [-o OUT.csv|.jsonl]");
  add_weights(sub, *o);
  sub->add_option("inputs", o->inputs,
                  "image files or folders, a .csv, IDX/.npy arrays, a chunk set; language models: "
                  "a token file (.bin, .npy) or text")
      ->required();
  sub->add_option("-o,--output", o->out, "OUT.csv or OUT.jsonl (default: JSON lines on stdout)");
  sub->add_option("--set", o->overrides, "key.path=value on the run's config.yaml (repeatable)");
  sub->add_option("--top-k", o->top_k,
                  "classification: the k likeliest classes only; language models: next tokens "
                  "listed (default 5)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--generate", o->generate, "language models: tokens to sample after the input")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--temperature", o->temperature, "sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--sample-top-k", o->sample_top_k, "sample among the k likeliest tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  sub->callback([o, &run] {
    run = [o] {
      deploy::predict_run(*o);
      return 0;
    };
  });
}

}  // namespace mltrain::cli
