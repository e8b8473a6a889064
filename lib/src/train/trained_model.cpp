#include "mltrain/train/pipeline.hpp"

#include <spdlog/spdlog.h>

#include "mltrain/core/error.hpp"
#include "mltrain/train/checkpoint.hpp"
#include "mltrain/formats/safetensors.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

TrainedModel load_trained_model(const fs::path& p, const std::string& who) {
  TrainedModel tm;
  if (!fs::exists(p))
    throw CheckpointError(p.string(), "does not exist",
                          "pass a run folder (runs/<name>/v<N>) or a checkpoint folder");
  if (fs::exists(p / "manifest.json")) {
    tm.checkpoint = p;
    tm.run_dir = p.parent_path().parent_path();
  } else if (fs::exists(p / "checkpoints")) {
    CheckpointStore store(p / "checkpoints", {});
    std::vector<std::string> warnings;
    auto ck = store.load_latest(&warnings);
    for (auto& w : warnings) spdlog::warn("[{}] {}", who, w);
    if (!ck) throw CheckpointError((p / "checkpoints").string(), "holds no intact checkpoint");
    tm.checkpoint = ck->dir;
    tm.run_dir = p;
  } else {
    throw CheckpointError(p.string(), "is neither a run folder nor a checkpoint folder",
                          "pass runs/<name>/v<N> or runs/<name>/v<N>/checkpoints/step_<N>");
  }
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
