#include <iostream>

#include "commands.hpp"
#include "mltrain/deploy/quantize.hpp"

namespace mltrain::cli {

void setup_quantize(CLI::App& app, Action& run) {
  struct Opts {
    std::string where;
    deploy::QuantizeOptions qo;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand(
      "quantize",
      "post-training int8 (mlp, cnn, resnet): mltrain quantize RUN_DIR|CHECKPOINT [--mode "
      "static|dynamic] "
      "[--calib-batches N] [--observer minmax|moving_average_minmax|percentile|entropy] "
      "[--exclude L1,L2] [--sensitivity]");
  sub->add_option("run", o->where, "run folder or checkpoint folder")->required();
  sub->add_option("--calib-batches", o->qo.calib_batches, "training batches of 128 for calibration")
      ->capture_default_str();
  sub->add_option("--observer", o->qo.observer, "activation range observer")
      ->check(CLI::IsMember({"minmax", "moving_average_minmax", "percentile", "entropy"}))
      ->capture_default_str();
  sub->add_option("--mode", o->qo.mode,
                  "static: int8 activations calibrated; dynamic: int8 linear weights, activations "
                  "quantized per batch")
      ->check(CLI::IsMember({"static", "dynamic"}))
      ->capture_default_str();
  sub->add_option("--exclude", o->qo.exclude,
                  "layers kept fp32 (names as the report lists them), comma-separated")
      ->delimiter(',');
  sub->add_flag("--sensitivity", o->qo.sensitivity,
                "quantize one layer at a time on the eval split and propose an exclude list");
  sub->add_option("--sensitivity-samples", o->qo.sensitivity_samples,
                  "eval samples per sensitivity pass")
      ->capture_default_str();
  sub->add_option("--sensitivity-threshold", o->qo.sensitivity_threshold,
                  "accuracy points a layer may cost before it is proposed for exclusion")
      ->capture_default_str();
  sub->add_option("--calib-cache", o->qo.cache_dir,
                  "calibration cache folder (default: <output>/calib_cache; 'off' disables it)");
  sub->add_option("--engine", o->qo.engine, "quantized kernels: auto | onednn | qnnpack")
      ->check(CLI::IsMember({"auto", "onednn", "qnnpack"}))
      ->capture_default_str();
  sub->add_option("-o,--output", o->qo.out_dir, "output folder (default: <run>/quantized)");
  sub->add_flag("--json", o->json, "print the JSON report");
  sub->callback([o, &run] {
    run = [o] {
      const auto r = deploy::quantize_run(o->where, o->qo);
      std::cout << (o->json ? r.to_json().dump(2) + "\n" : r.to_text());
      return 0;
    };
  });
}

}  // namespace mltrain::cli
