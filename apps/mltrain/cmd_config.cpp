#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/config/study.hpp"
#include "mltrain/train/pipeline.hpp"

namespace mltrain::cli {

void setup_config(CLI::App& app, Action& run) {
  auto* sub = app.add_subcommand("config", "inspect the config schema");
  auto* schema = sub->add_subcommand("schema", "every key with its type, default and description");
  auto study = std::make_shared<bool>(false);
  schema->add_flag("--study", *study,
                   "the keys of a tune study file (mltrain tune STUDY.yaml) instead");
  auto check_file = std::make_shared<std::string>();
  auto check_ov = std::make_shared<std::vector<std::string>>();
  auto* check =
      sub->add_subcommand("check", "validate a config (all errors at once) without running it");
  check->add_option("config", *check_file, "experiment config")->required();
  check->add_option("overrides", *check_ov, "key.path=value overrides");
  auto metrics_file = std::make_shared<std::string>();
  auto metrics_ov = std::make_shared<std::vector<std::string>>();
  auto* metrics = sub->add_subcommand(
      "metrics", "the metrics a config's task reports (names for monitors and tune objectives)");
  metrics->add_option("config", *metrics_file, "experiment config (omit: the defaults)");
  metrics->add_option("overrides", *metrics_ov,
                      "key.path=value overrides, e.g. task.name=regression");
  sub->require_subcommand(1);
  metrics->callback([&run, metrics_file, metrics_ov] {
    run = [metrics_file, metrics_ov] {
      // `mltrain config metrics task.name=regression`: no file, overrides only.
      std::vector<std::string> ov = *metrics_ov;
      std::string file = *metrics_file;
      if (file.find('=') != std::string::npos && !std::filesystem::exists(file)) {
        ov.insert(ov.begin(), file);
        file.clear();
      }
      const auto cfg = config::load_experiment(file, ov);
      for (const auto& m : config::task_metrics(cfg))
        std::cout << m << "\t" << config::metric_mode(m) << "\n";
      if (cfg.task.name == "custom")
        std::cout << "eval_<name>\t(each scalar the model's forward returns next to 'loss')\n";
      return 0;
    };
  });
  schema->callback([&run, study] {
    run = [study] {
      std::cout << (*study ? config::study_schema_text() : config::schema_text());
      return 0;
    };
  });
  check->callback([&run, check_file, check_ov] {
    run = [check_file, check_ov] {
      const auto cfg = config::load_experiment(*check_file, *check_ov);
      std::cout << *check_file << ": ok\n";
      for (const auto& n : train::config_notes(cfg)) std::cout << "note: " << n << "\n";
      return 0;
    };
  });
}

}  // namespace mltrain::cli
