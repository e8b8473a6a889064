#pragma once
// Each subcommand: setup_<name>(app) registers its options and sets `run` to the action.
#include <CLI/CLI.hpp>

#include <functional>

namespace mltrain::cli {
using Action = std::function<int()>;
void setup_train(CLI::App& app, Action& run);
void setup_config(CLI::App& app, Action& run);
void setup_data(CLI::App& app, Action& run);
void setup_schedule(CLI::App& app, Action& run);
void setup_landscape(CLI::App& app, Action& run);
void setup_profile(CLI::App& app, Action& run);
void setup_checklist(CLI::App& app, Action& run);
void setup_runs(CLI::App& app, Action& run);
void setup_report(CLI::App& app, Action& run);
void setup_fuse(CLI::App& app, Action& run);
void setup_quantize(CLI::App& app, Action& run);
void setup_evaluate(CLI::App& app, Action& run);
void setup_predict(CLI::App& app, Action& run);
void setup_tune(CLI::App& app, Action& run);
void setup_launch(CLI::App& app, Action& run);
void setup_slurm(CLI::App& app, Action& run);
void setup_completion(CLI::App& app, Action& run);
void setup_init(CLI::App& app, Action& run);
void setup_track(CLI::App& app, Action& run);
}  // namespace mltrain::cli
