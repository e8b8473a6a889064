#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/dist/slurm.hpp"

namespace fs = std::filesystem;

namespace mltrain::cli {

void setup_slurm(CLI::App& app, Action& run) {
  struct Opts {
    std::string config;
    std::vector<std::string> overrides;
    dist::SbatchOptions so;
    bool submit = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand(
      "slurm",
      "write (and with --submit, submit) an sbatch script for a training run: mltrain slurm "
      "CONFIG.yaml "
      "--nodes N --ntasks-per-node G --time T [--partition P] [--submit] [key=value ...]");
  sub->add_option("config", o->config, "experiment config")->required();
  sub->add_option("overrides", o->overrides, "key.path=value overrides passed to mltrain train");
  sub->add_option("--nodes", o->so.nodes, "nodes")->capture_default_str();
  sub->add_option("--ntasks-per-node", o->so.ntasks_per_node,
                  "ranks per node (one per GPU on GPU nodes)")
      ->capture_default_str();
  sub->add_option("--time", o->so.time, "time limit (Slurm format, e.g. 04:00:00)")
      ->capture_default_str();
  sub->add_option("--partition", o->so.partition, "partition");
  sub->add_option("--signal-lead", o->so.signal_lead_s,
                  "seconds before the limit at which Slurm sends USR1")
      ->capture_default_str();
  sub->add_flag("--submit", o->submit, "submit with sbatch and print the job id");
  sub->callback([o, &run] {
    run = [o] {
      // Here, not in the queue, and before a script is written.
      dist::check_sbatch_options(o->so);
      const auto cfg = config::load_experiment(
          o->config, o->overrides);  // a bad config fails here, not in the queue
      auto so = o->so;
      so.mltrain = self_exe();
      so.config = fs::absolute(o->config).string();
      so.overrides = o->overrides;
      so.job_name = cfg.run.name;
      const fs::path dir = fs::absolute(fs::path(cfg.run.dir) / cfg.run.name);
      fs::create_directories(dir);
      so.workdir = fs::current_path().string();  // the job runs where it was submitted from
      so.output = (dir / "slurm.sbatch").string();
      so.log_dir = dir.string();
      write_file_atomic(so.output, dist::sbatch_script(so));
      fs::permissions(so.output, fs::perms::owner_exec, fs::perm_options::add);
      std::cout << "wrote " << so.output << "\n";
      if (!o->submit) return 0;
      const std::string out = sbatch_submit(so.output);
      std::cout << "submitted job " << out << "\n";
      return 0;
    };
  });
}

}  // namespace mltrain::cli
