#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "mltrain/config/schema.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/track/mlflow.hpp"

namespace mltrain::cli {

void setup_track(CLI::App& app, Action& run) {
  struct Opts {
    std::vector<std::string> dirs;
    config::MlflowConfig mlflow;
    bool json = false;
    int jobs = 4;
  };
  auto o = std::make_shared<Opts>();
  auto* track = app.add_subcommand("track", "tracking servers: mltrain track push RUN_DIR...");
  track->require_subcommand(1);
  auto* push = track->add_subcommand(
      "push",
      "send run folders (finished, failed, interrupted) or tune studies (a parent run, one child "
      "run per trial) to MLflow, exactly once: what the server already has is skipped");
  push->add_option("dirs", o->dirs, "run folders (runs/<name>/v<N>), run name folders, or studies")
      ->required();
  push->add_option("--uri", o->mlflow.uri, "MLflow server (default: MLFLOW_TRACKING_URI)");
  push->add_option("--experiment", o->mlflow.experiment,
                   "experiment (default: MLFLOW_EXPERIMENT_NAME, else the run's or study's name)");
  push->add_option("--artifacts", o->mlflow.artifacts,
                   "files uploaded for finished runs: none | config | model")
      ->check(CLI::IsMember({"none", "config", "model"}))
      ->capture_default_str();
  push->add_option("-j,--jobs", o->jobs, "folders sent at a time")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  push->add_flag("--json", o->json, "print one JSON report");
  push->callback([o, &run] {
    run = [o] {
      if (const std::string why = config::tracking_uri_problem(o->mlflow.uri); !why.empty())
        throw ConfigError("--uri", why, "give the server's address, e.g. http://127.0.0.1:5000");
      const auto target = track::mlflow_target(o->mlflow, "");
      if (!target)
        throw ConfigError("track push", "no MLflow server given",
                          "pass --uri http://HOST:PORT or set MLFLOW_TRACKING_URI");
      std::vector<std::filesystem::path> dirs(o->dirs.begin(), o->dirs.end());
      const auto reports = track::push_folders(dirs, *target, o->jobs);
      int code = 0;
      nlohmann::json j = nlohmann::json::array();
      for (const auto& [dir, r] : reports) {
        j.push_back({{"dir", dir.string()},
                     {"run_id", r.run_id},
                     {"sent", r.sent},
                     {"skipped", r.skipped},
                     {"left", r.left},
                     {"error", r.error}});
        if (!o->json)
          std::cout << dir.string() << ": " << (r.error.empty() ? "" : "error: " + r.error + "; ")
                    << r.sent << " record(s) sent, " << r.skipped << " already there"
                    << (r.left ? ", " + std::to_string(r.left) + " left" : "")
                    << (r.run_id.empty() ? "" : " (MLflow run " + r.run_id + ")") << "\n";
        if (!r.error.empty()) code = std::max(code, r.auth ? int(kExitUsage) : int(kExitRuntime));
      }
      if (o->json) std::cout << j.dump(2) << "\n";
      return code;
    };
  });
}

}  // namespace mltrain::cli
