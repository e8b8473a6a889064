#include <fstream>
#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/config/format.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/svg.hpp"
#include "mltrain/optim/schedule.hpp"
#include "mltrain/train/pipeline.hpp"
#include "mltrain/train/trainer.hpp"

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
      auto cfg = config::load_experiment(o->config, o->overrides);
      // Epoch-based periods need the epoch length: the loader the run would build knows it.
      auto splits = train::load_splits(cfg);
      data::LoaderOptions lo;
      lo.batch_size = cfg.data.batch_size;
      lo.drop_last = cfg.data.drop_last;
      const data::Loader loader(splits.train, lo);
      auto plan = train::plan_steps(cfg, loader.batches_per_epoch(), /*world=*/1);
      const int64_t spe = plan.steps_per_epoch;
      const int64_t steps = o->steps > 0 ? o->steps : plan.total_steps;
      optim::Schedule& sched = *plan.lr;
      if (cfg.schedule.name == "plateau")
        std::cerr << "note: plateau depends on evaluations; without training it shows the LR "
                     "before any drop\n";
      std::vector<double> xs, ys;
      for (int64_t t = 0; t < steps; ++t)
        xs.push_back(static_cast<double>(t)), ys.push_back(sched.lr(t));
      if (!o->csv.empty()) {
        std::string s = "step,lr\n";
        for (int64_t t = 0; t < steps; ++t)
          s += std::to_string(t) + "," + config::format_double(ys[t]) + "\n";
        write_file_atomic(o->csv, s);
      }
      if (!o->svg.empty()) {
        SvgChart chart(cfg.schedule.name + " schedule (" + std::to_string(spe) + " steps/epoch)",
                       "optimizer step", "learning rate");
        chart.add_series(cfg.schedule.name, xs, ys);
        write_file_atomic(o->svg, chart.render());
      }
      if (o->csv.empty() && o->svg.empty()) {
        const int64_t every = std::max<int64_t>(1, steps / 20);
        std::cout << "step  lr\n";
        for (int64_t t = 0; t < steps; t += every)
          std::cout << t << "  " << config::format_double(ys[t]) << "\n";
        if ((steps - 1) % every)
          std::cout << steps - 1 << "  " << config::format_double(ys[steps - 1]) << "\n";
      }
      return 0;
    };
  });
}

}  // namespace mltrain::cli
