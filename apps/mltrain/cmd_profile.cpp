#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/profile/profile.hpp"

namespace mltrain::cli {

void setup_profile(CLI::App& app, Action& run) {
  auto opt = std::make_shared<profile::ProfileOptions>();
  auto json = std::make_shared<bool>(false);
  auto no_ops = std::make_shared<bool>(false);
  auto apply = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("profile",
                                 "find the bottleneck of a training config: mltrain profile "
                                 "CONFIG.yaml [key=value ...] [--sweep KEY=v1,v2]");
  sub->add_option("config", opt->config_path, "experiment config")->required();
  sub->add_option("overrides", opt->overrides, "key.path=value overrides, as for train");
  sub->add_option("--wait", opt->wait, "steps run before anything is recorded")
      ->capture_default_str();
  sub->add_option("--warmup", opt->warmup, "steps recorded by the profiler, then discarded")
      ->capture_default_str();
  sub->add_option("--active", opt->active, "steps measured")->capture_default_str();
  sub->add_option("--top", opt->top, "operators in the table")->capture_default_str();
  sub->add_option("--sweep", opt->sweep,
                  "KEY=v1,v2,...: measure once per value (e.g. data.workers=0,1,2,4)");
  sub->add_option("--out", opt->out_dir,
                  "folder for profile.json, phases.svg, report.txt, trace.json.gz "
                  "(default: <run.dir>/<run.name>/profile)");
  sub->add_option("--apply", *apply,
                  "with --sweep: write the resolved config with the fastest value to this file "
                  "(a copy: CONFIG.yaml is left as it is)");
  sub->add_flag("--fix", opt->fix,
                "propose concrete changes for the diagnosis, measure each against the baseline in "
                "interleaved rounds, keep only those faster in every round, write fixed.yaml");
  sub->add_option("--fix-rounds", opt->fix_rounds, "interleaved rounds for --fix")
      ->capture_default_str();
  sub->add_flag("--no-ops", *no_ops, "skip the operator-profiler pass");
  sub->add_flag("--json", *json, "print the JSON report instead of text");
  sub->callback([opt, json, no_ops, apply, &run] {
    run = [opt, json, no_ops, apply] {
      const auto cfg = config::load_experiment(opt->config_path, opt->overrides);
      profile::ProfileOptions o = *opt;
      o.ops = !*no_ops;
      o.apply = *apply;
      if (o.out_dir.empty()) o.out_dir = cfg.run.dir + "/" + cfg.run.name + "/profile";
      const auto report = profile::profile_config(cfg, o);
      if (*json)
        std::cout << report.to_json().dump(2) << "\n";
      else
        std::cout << report.to_text() << "files: " << o.out_dir
                  << "/{profile.json,phases.svg,report.txt" << (report.fix ? ",fixed.yaml" : "")
                  << "}\n";
      return 0;
    };
  });
}

}  // namespace mltrain::cli
