#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/train/pipeline.hpp"

namespace mltrain::cli {

void setup_schedule(CLI::App& app, Action& run) {
  struct Opts {
    std::string config, csv, svg;
    std::vector<std::string> overrides;
    int64_t steps = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand(
      "schedule", "print or draw the learning rate per step of a config, without training");
  sub->add_option("config", o->config, "experiment config")->required();
  sub->add_option("overrides", o->overrides, "key.path=value overrides");
  sub->add_option("--steps", o->steps, "steps to show (default: train.duration)");
  sub->add_option("--csv", o->csv, "write step,lr for every step to this file");
  sub->add_option("--svg", o->svg, "draw the curve into this SVG file");
  sub->callback([&run, o] {
    run = [o] {
      const auto cfg = config::load_experiment(o->config, o->overrides);
      const train::LrCurve curve = train::lr_curve(cfg, o->steps);
      if (!o->csv.empty()) write_file_atomic(o->csv, curve.to_csv());
      if (!o->svg.empty()) write_file_atomic(o->svg, curve.to_svg());
      if (o->csv.empty() && o->svg.empty()) std::cout << curve.to_text();
      return 0;
    };
  });
}

}  // namespace mltrain::cli
