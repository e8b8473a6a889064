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
  if (!path.empty()) {
    if (!std::filesystem::exists(path))
      throw ConfigError(path, "config file not found", "check the path (configs/ has examples)");
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::ParserException& e) {
      throw ConfigError(mark_text(path, e.mark), "not valid YAML: " + e.msg,
                        "fix the syntax at that line (indentation, a missing ':' or quote)");
    } catch (const YAML::BadFile&) {
      throw ConfigError(path, "cannot read the config file", "check its permissions");
    }
    if (!root.IsMap() && !root.IsNull()) {
      issues.add(mark_text(path, root.Mark()), "",
                 "the top level must be a mapping (run:, data:, model: ...)");
      root = YAML::Node();
    }
  }
  Overrides ov = parse_overrides(overrides, issues);
  ExperimentConfig cfg;
  std::vector<std::string> declared;
  Reader reader(root, path.empty() ? "<defaults>" : path, "", ov, issues, declared);
  cfg.visit(reader);
  reader.finish();
  for (auto& [key, o] : ov) {
    if (o.used) continue;
    std::string hint = did_you_mean(key, declared);
    issues.add("override '" + o.text + "'", key,
               "unknown key" + (hint.empty() ? std::string() : " (did you mean '" + hint + "'?)"));
  }
  if (cfg.run.name.empty() && !path.empty())
    cfg.run.name = std::filesystem::path(path).stem().string();
  if (cfg.run.name.empty()) cfg.run.name = "default";
  if (issues.empty()) cross_checks(cfg, issues, path.empty() ? "<defaults>" : path);
  issues.throw_if_any();
  return cfg;
}

std::string to_yaml(const ExperimentConfig& cfg) {
  YamlWriter w;
  const_cast<ExperimentConfig&>(cfg).visit(w);
  return w.text();
}

std::string schema_text() {
  ExperimentConfig defaults;
  SchemaWriter w;
  defaults.visit(w);
  return w.text();
}

}  // namespace mltrain::config
