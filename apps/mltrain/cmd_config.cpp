#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/config/study.hpp"

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
  sub->require_subcommand(1);
  schema->callback([&run, study] {
    run = [study] {
      std::cout << (*study ? config::study_schema_text() : config::schema_text());
      return 0;
    };
  });
  check->callback([&run, check_file, check_ov] {
    run = [check_file, check_ov] {
      config::load_experiment(*check_file, *check_ov);
      std::cout << *check_file << ": ok\n";
      return 0;
    };
  });
}

}  // namespace mltrain::cli
