#include "mltrain/train/pipeline.hpp"

#include <spdlog/spdlog.h>

#include <fstream>

#include "mltrain/core/error.hpp"
#include "mltrain/train/checkpoint.hpp"
#include "mltrain/train/observers.hpp"
#include "mltrain/formats/safetensors.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

namespace {

struct Located {
  fs::path checkpoint, run_dir;
};

// The checkpoint `p` names: a checkpoint folder itself, or a run folder's latest intact one.
Located locate(const fs::path& p, const std::string& who) {
  if (!fs::exists(p))
    throw CheckpointError(p.string(), "does not exist",
                          "pass a run folder (runs/<name>/v<N>) or a checkpoint folder");
  if (fs::exists(p / "manifest.json")) return {p, p.parent_path().parent_path()};
  if (!fs::exists(p / "checkpoints"))
    throw CheckpointError(p.string(), "is neither a run folder nor a checkpoint folder",
                          "pass runs/<name>/v<N> or runs/<name>/v<N>/checkpoints/step_<N>");
  CheckpointStore store(p / "checkpoints", {});
  std::vector<std::string> warnings;
  auto ck = store.load_latest(&warnings);
  for (auto& w : warnings) spdlog::warn("[{}] {}", who, w);
  if (!ck)
    throw CheckpointError((p / "checkpoints").string(), "holds no intact checkpoint",
                          "train the run (or resume it) until it writes one");
  return {ck->dir, p};
}

// The kept checkpoint whose trainer.json records the best monitored metric.
fs::path best_checkpoint(const fs::path& run_dir, const config::ExperimentConfig& cfg) {
  const bool maximize = config::checkpoint_mode(cfg) == "max";
  fs::path best;
  double best_value = 0;
  for (const fs::path& d : CheckpointStore::list_complete(run_dir / "checkpoints")) {
    if (!CheckpointStore::verify(d).empty()) continue;
    std::ifstream in(d / "trainer.json");
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("monitor")) continue;
    const double v = j["monitor"].get<double>();
    if (best.empty() || (maximize ? v > best_value : v < best_value)) best = d, best_value = v;
  }
  if (best.empty())
    throw CheckpointError(
        (run_dir / "checkpoints").string(),
        "no intact checkpoint records the monitored metric (" + cfg.checkpoint.monitor + ")",
        "use the last weights (--last), or train with evaluations "
        "(train.eval_every) so checkpoints record it");
  return best;
}

}  // namespace

RestoredRun restore_run(const fs::path& where, const std::vector<std::string>& overrides,
                        Weights which, const std::string& who) {
  Located at = locate(where, who);
  const fs::path config = at.run_dir / "config.yaml";
  if (!fs::exists(config))
    throw CheckpointError(config.string(),
                          "missing: the run's resolved config is needed to rebuild the model");
  const config::ExperimentConfig cfg = config::load_experiment(config.string(), overrides);
  if (which == Weights::kBest) {
    if (fs::exists(where / "manifest.json"))
      throw ConfigError("--best", "a checkpoint folder names its own weights",
                        "pass the run folder with --best, or drop --best");
    at.checkpoint = best_checkpoint(at.run_dir, cfg);
  }
  const LoadedCheckpoint ck = CheckpointStore::load_dir(at.checkpoint);  // verifies SHA-256s
  RestoredRun r;
  r.pipeline = build_pipeline(cfg, dist::World{});
  restore_checkpoint(ck, *r.pipeline->trainer);
  r.run_dir = at.run_dir;
  r.checkpoint = at.checkpoint;
  r.step = ck.step;
  spdlog::info("[{}] {} (step {}) of {}", who, at.checkpoint.string(), ck.step,
               at.run_dir.string());
  return r;
}

TrainedModel load_trained_model(const fs::path& p, const std::string& who) {
  TrainedModel tm;
  const Located at = locate(p, who);
  tm.checkpoint = at.checkpoint;
  tm.run_dir = at.run_dir;
  CheckpointStore::load_dir(tm.checkpoint);  // verifies the manifest's SHA-256s
  const fs::path config = tm.run_dir / "config.yaml";
  if (!fs::exists(config))
    throw CheckpointError(config.string(),
                          "missing: the run's resolved config is needed to rebuild the model");
  tm.cfg = config::load_experiment(config.string(), {});
  // fuse, quantize and landscape check and report class logits (agreement, accuracy).
  if (tm.cfg.task.name != "classification")
    throw ConfigError("task.name",
                      "`mltrain " + who + "` works on classifiers; " + config.string() +
                          " trained task " + tm.cfg.task.name,
                      "run it on a classification run (profile and tune take every task)");
  // The model as the run built it, on the CPU: these commands evaluate and export on the host.
  config::ExperimentConfig on_host = tm.cfg;
  on_host.runtime.device = "cpu";
  auto built = build_pipeline(on_host, dist::World{}, model_only());
  tm.splits = std::move(built->splits);
  tm.model = std::move(built->model);
  const std::string wpath = (tm.checkpoint / "model.safetensors").string();
  auto weights = formats::load_safetensors(wpath);
  torch::NoGradGuard no_grad;
  model::NamedTensors params = tm.model->named_parameters();
  for (auto& b : tm.model->named_buffers()) params.push_back(b);
  for (auto& [name, t] : params) {
    auto it = weights.find(name);
    if (it == weights.end() || it->second.sizes() != t.sizes())
      throw CheckpointError(wpath, "does not match the run's model at '" + name + "'",
                            "pass the checkpoint of the run whose config.yaml sits beside it");
    t.copy_(it->second);
  }
  tm.model->set_training(false);
  return tm;
}

}  // namespace mltrain::train
