#include "mltrain/train/trained_model.hpp"

#include <spdlog/spdlog.h>

#include "mltrain/core/error.hpp"
#include "mltrain/core/runtime.hpp"
#include "mltrain/train/checkpoint.hpp"
#include "mltrain/train/safetensors.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

TrainedModel load_trained_model(const fs::path& p, const std::string& who) {
  TrainedModel tm;
  if (!fs::exists(p)) throw CheckpointError(p.string(), "does not exist", "pass a run folder (runs/<name>/v<N>) or a checkpoint folder");
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
  if (!fs::exists(config)) throw CheckpointError(config.string(), "missing: the run's resolved config is needed to rebuild the model");
  tm.cfg = config::load_experiment(config.string(), {});
  runtime::apply({static_cast<int>(tm.cfg.runtime.threads.resolve(0)), tm.cfg.runtime.kernel_route, tm.cfg.runtime.allocator});
  tm.splits = load_splits(tm.cfg.data);
  tm.model = model::build_model(tm.cfg.model, tm.splits.train.sample_shape, tm.cfg.data.num_classes, tm.cfg.run.seed);
  const std::string wpath = (tm.checkpoint / "model.safetensors").string();
  auto weights = load_safetensors(wpath);
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
