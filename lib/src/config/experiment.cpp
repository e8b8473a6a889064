#include "mltrain/config/experiment.hpp"

#include <filesystem>
#include <fstream>

#include "mltrain/config/reader.hpp"
#include "mltrain/config/writer.hpp"

namespace mltrain::config {

static void cross_checks(const ExperimentConfig& c, Issues& issues, const std::string& file) {
  auto need = [&](bool ok, const std::string& path, const std::string& msg) {
    if (!ok) issues.add(file, path, msg);
  };
  if (c.data.dataset == "files") {
    need(!c.data.train_images.empty(), "data.train_images", "required when data.dataset is files");
    need(!c.data.test_images.empty(), "data.test_images", "required when data.dataset is files");
  }
  need(c.model.name != "torchscript" || !c.model.path.empty(), "model.path",
       "required when model.name is torchscript");
  need(c.model.widths.size() == c.model.depths.size(), "model.depths",
       "needs one entry per model.widths entry");
  need(c.model.channels.size() == 2, "model.channels",
       "the cnn has exactly two conv layers: give 2 values");
  need(!c.model.hidden.empty(), "model.hidden", "give at least one hidden width");
}

ExperimentConfig load_experiment(const std::string& path,
                                 const std::vector<std::string>& overrides) {
  Issues issues;
  YAML::Node root;
  if (!path.empty())
    root = load_yaml_file(path, "config", "configs/ has examples", "run:, data:, model:", issues);
  ExperimentConfig cfg;
  read_settings(root, path.empty() ? "<defaults>" : path, overrides, issues, cfg);
  if (cfg.run.name.empty() && !path.empty())
    cfg.run.name = std::filesystem::path(path).stem().string();
  if (cfg.run.name.empty()) cfg.run.name = "default";
  if (issues.empty()) cross_checks(cfg, issues, path.empty() ? "<defaults>" : path);
  issues.throw_if_any();
  return cfg;
}

std::string to_yaml(const ExperimentConfig& cfg) { return yaml_of(cfg); }

std::string schema_text() { return schema_of<ExperimentConfig>(); }

}  // namespace mltrain::config
