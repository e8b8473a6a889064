#pragma once
// A trained model back from disk, for the commands that work on finished runs (landscape, fuse):
// RUN_DIR (its latest intact checkpoint) or a checkpoint folder; the manifest is verified, the
// model is rebuilt from the run's resolved config.yaml and its weights loaded (CheckpointError,
// exit 3, when anything is missing, damaged or of another model).
//
//   auto tm = load_trained_model("runs/cnn/v0", "fuse");
//   tm.model->set_training(false);
#include <filesystem>
#include <memory>

#include "mltrain/config/experiment.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/train/run.hpp"

namespace mltrain::train {

struct TrainedModel {
  config::ExperimentConfig cfg;
  std::unique_ptr<model::Model> model;
  std::filesystem::path checkpoint, run_dir;
  Splits splits;
};

TrainedModel load_trained_model(const std::filesystem::path& run_or_checkpoint, const std::string& who);

}  // namespace mltrain::train
