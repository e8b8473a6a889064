#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/checklist/checklist.hpp"

namespace mltrain::cli {

void setup_checklist(CLI::App& app, Action& run) {
  struct Opts {
    std::string config, level = "quick";
    std::vector<std::string> overrides;
    bool json = false;
  };
  auto opt = std::make_shared<Opts>();
  auto* sub = app.add_subcommand(
      "checklist",
      "check this node (and a config's pipeline) against the optimisation checklist; "
      "exit 4 on any FAIL: mltrain checklist [CONFIG.yaml] [--level quick|full] [--json]");
  sub->add_option("config", opt->config,
                  "experiment config whose data, model and runtime to check (optional)");
  sub->add_option("overrides", opt->overrides, "key.path=value overrides, as for train");
  sub->add_option("--level", opt->level, "quick (< 30 s) or full (larger measurements)")
      ->check(CLI::IsMember({"quick", "full"}))
      ->capture_default_str();
  sub->add_flag("--json", opt->json, "print JSON instead of text");
  sub->callback([opt, &run] {
    run = [opt] {
      std::optional<config::ExperimentConfig> cfg;
      if (!opt->config.empty()) cfg = config::load_experiment(opt->config, opt->overrides);
      checklist::ChecklistOptions o;
      o.level = opt->level;
      o.cfg = cfg ? &*cfg : nullptr;
      o.config_path = opt->config;
      const auto report = checklist::run_checklist(o);
      std::cout << (opt->json ? report.to_json().dump(2) + "\n" : report.to_text());
      return report.failed() ? kExitCheckFailed : kExitOk;
    };
  });
}

}  // namespace mltrain::cli
