#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/core/signals.hpp"
#include "mltrain/dist/launch.hpp"
#include "mltrain/train/run.hpp"

namespace mltrain::cli {

namespace {
struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  bool print_config = false;
  std::string run_name;
  int threads = -1;
  bool jsonl = false;
};

// Flags are the highest precedence: they replace an override of the same key.
void set_flag(std::vector<std::string>& ov, const std::string& key, const std::string& value) {
  ov.erase(std::remove_if(ov.begin(), ov.end(),
                          [&](const std::string& s) { return s.rfind(key + "=", 0) == 0; }),
           ov.end());
  ov.push_back(key + "=" + value);
}
}  // namespace

void setup_train(CLI::App& app, Action& run) {
  auto opt = std::make_shared<TrainOptions>();
  auto* sub = app.add_subcommand(
      "train", "train a model from a YAML config: mltrain train CONFIG.yaml [key.path=value ...]");
  sub->add_option("config", opt->config, "experiment config (see configs/)")->required();
  sub->add_option("overrides", opt->overrides,
                  "key.path=value overrides, e.g. optim.lr=0.01 train.duration=2ep");
  sub->add_flag("--print-config", opt->print_config, "print the resolved config and exit");
  sub->add_option("--run-name", opt->run_name, "same as run.name=...");
  sub->add_option("--threads", opt->threads, "same as runtime.threads=...");
  sub->add_flag("--jsonl", opt->jsonl,
                "print each evaluation and the final summary as JSON lines on stdout (what "
                "`mltrain tune` reads)");
  sub->callback([opt, &run, &app] {
    run = [opt, &app] {
      auto ov = opt->overrides;
      if (!opt->run_name.empty()) set_flag(ov, "run.name", opt->run_name);
      if (opt->threads >= 0) set_flag(ov, "runtime.threads", std::to_string(opt->threads));
      auto cfg = config::load_experiment(opt->config, ov);
      if (opt->print_config) {
        std::cout << config::to_yaml(cfg);
        return 0;
      }
      // The `distributed:` block: this process may become the launcher of copies of itself.
      std::vector<std::string> self = {self_exe(), "train", opt->config};
      self.insert(self.end(), ov.begin(), ov.end());
      if (opt->jsonl) self.push_back("--jsonl");
      if (const auto launched = dist::launch_if_configured(cfg.distributed, self)) return *launched;
      watch_stop_signals();  // before LibTorch, the loader or Gloo start any thread
      train::RunOptions ro;
      ro.config_path = opt->config;
      ro.command_line = {"mltrain", "train", opt->config};
      ro.command_line.insert(ro.command_line.end(), ov.begin(), ov.end());
      ro.tty = ::isatty(STDERR_FILENO);
      ro.jsonl_stdout = opt->jsonl;
      auto r = train::run_training(cfg, ro);
      if (r.rank != 0) return 0;  // rank 0 reports for the group
      std::ostream& human = opt->jsonl ? std::cerr : std::cout;
      if (r.test_metrics.empty() && std::isnan(r.test_loss)) {
        human << "no test evaluation (train.final_eval=none)";
      } else if (cfg.task.name == "classification") {
        human << "test accuracy: " << r.test_accuracy << " (loss " << r.test_loss << ")";
      } else {
        human << "test";
        for (const auto& [k, v] : r.test_metrics)
          if (k.rfind("roc_auc_class", 0) != 0) human << " " << k << " " << v;
      }
      human << " after " << r.steps << " steps, " << r.train_seconds << " s of training\n";
      if (cfg.train.target_accuracy > 0) {
        if (r.time_to_target)
          human << "time to " << cfg.train.target_accuracy
                << " test accuracy: " << *r.time_to_target << " s\n";
        else
          human << "target accuracy " << cfg.train.target_accuracy << " not reached\n";
      }
      human << "run folder: " << r.run_dir.string() << "\n";
      return 0;
    };
  });
}

}  // namespace mltrain::cli
