#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.hpp"
#include "install.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/config/study.hpp"
#include "mltrain/train/pipeline.hpp"

namespace mltrain::cli {
namespace {

namespace fs = std::filesystem;

// The example configs by name ("fashion_mnist_cnn", "tune/branin"), each with its first comment
// line, from where this mltrain is installed (install.hpp).
std::vector<std::pair<std::string, std::string>> examples(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    std::string name = fs::relative(e.path(), dir).replace_extension().string();
    std::ifstream f(e.path());
    std::string line, about;
    while (about.empty() && std::getline(f, line))
      if (line.rfind("# ", 0) == 0) about = line.substr(2);
    out.emplace_back(std::move(name), std::move(about));
  }
  std::sort(out.begin(), out.end());
  return out;
}

int run_example(const std::string& name, std::string out, bool force) {
  const fs::path dir = examples_dir();
  if (dir.empty())
    throw ConfigError("mltrain config example",
                      "this installation has no example configs (neither share/configs beside "
                      "the binary nor the checkout it was built from)",
                      "reinstall the wheel, or run from a checkout (configs/)");
  const auto all = examples(dir);
  if (name.empty()) {
    size_t w = 0;
    for (const auto& [n, about] : all) w = std::max(w, n.size());
    for (const auto& [n, about] : all)
      std::cout << n << std::string(w + 2 - n.size(), ' ') << about << "\n";
    std::cout << "\nfrom " << dir.string()
              << "\nwrite one: mltrain config example NAME [-o FILE]; all, with the paths the tune "
                 "studies use: cp -r "
              << dir.string() << " configs\n";
    return 0;
  }
  const auto hit = std::find_if(all.begin(), all.end(), [&](const auto& e) {
    return e.first == name || e.first + ".yaml" == name;
  });
  if (hit == all.end()) {
    std::string names;
    for (const auto& [n, about] : all) names += (names.empty() ? "" : ", ") + n;
    throw ConfigError("mltrain config example", "no example named '" + name + "'",
                      "one of: " + names);
  }
  if (out.empty()) out = fs::path(hit->first).filename().string() + ".yaml";
  if (fs::exists(out) && !force)
    throw ConfigError(out, "exists; not overwritten", "pass --force, or -o another file");
  const fs::path src = dir / (hit->first + ".yaml");
  fs::copy_file(src, out, fs::copy_options::overwrite_existing);
  std::cout << "wrote " << out << " (from " << src.string() << "); run it: mltrain train " << out
            << "\n";
  return 0;
}

}  // namespace

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
  auto ex_name = std::make_shared<std::string>();
  auto ex_out = std::make_shared<std::string>();
  auto ex_force = std::make_shared<bool>(false);
  auto* example = sub->add_subcommand(
      "example",
      "list the example configs shipped with mltrain, or write one: config example NAME");
  example->add_option("name", *ex_name, "the example to write (omit: list them)");
  example->add_option("-o,--output", *ex_out, "the file to write (default: NAME.yaml here)");
  example->add_flag("--force", *ex_force, "overwrite the output if it exists");
  sub->require_subcommand(1);
  example->callback([&run, ex_name, ex_out, ex_force] {
    run = [ex_name, ex_out, ex_force] { return run_example(*ex_name, *ex_out, *ex_force); };
  });
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
