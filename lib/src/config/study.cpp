#include "mltrain/config/study.hpp"

#include <cmath>
#include <filesystem>

#include "mltrain/config/reader.hpp"
#include "mltrain/config/writer.hpp"

namespace mltrain::config {

namespace {

// One parameter's range: what no single field's check can see.
void check_param(const std::string& name, const ParamSettings& p, Issues& issues,
                 const std::string& file) {
  const std::string path = "space." + name;
  auto at = [&](const std::string& key, const std::string& msg) {
    issues.add_at(key.empty() ? path : path + "." + key, msg, file);
  };
  auto given = [&](const char* key) { return issues.has_origin(path + "." + key); };
  if (issues.any_under(path)) return;  // already reported: a field that could not be read
  if (p.type.empty()) {
    issues.add_at(path, "missing type; use float, int or categorical", file);
    return;
  }
  if (p.type == "categorical") {
    if (p.choices.empty())
      at("choices", "a categorical parameter needs a non-empty list of choices");
    return;
  }
  if (!given("low") || !given("high")) {
    issues.add_at(path, "needs low and high", file);
    return;
  }
  if (!(p.low < p.high))
    issues.add_at(
        path,
        "low must be below high (" + format_double(p.low) + " >= " + format_double(p.high) + ")",
        file);
  if (p.log && p.low <= 0) at("low", "a log-scaled parameter needs low > 0");
  if (p.log && p.step > 0 && p.type == "float")
    issues.add_at(path, "log and step cannot be combined", file);
  if (p.type == "int" && (p.low != std::floor(p.low) || p.high != std::floor(p.high)))
    issues.add_at(path, "an int parameter needs integer low and high", file);
  for (double g : p.grid)
    if (g < p.low || g > p.high)
      at("grid", "value " + format_double(g) + " is outside [low, high]");
}

void cross_checks(const StudyFile& s, Issues& issues, const std::string& file, bool in_folder) {
  const int kinds =
      !s.objective.function.empty() + !s.trial.train.empty() + !s.trial.command.empty();
  if (kinds == 0)
    issues.add(file, "objective",
               "nothing to tune: set trial.train (a config for mltrain train), trial.command, or "
               "objective.function");
  if (kinds > 1)
    issues.add(file, "trial", "choose one of trial.train, trial.command and objective.function");
  if (!in_folder && !s.trial.train.empty() && !std::filesystem::exists(s.trial.train))
    issues.add_at("trial.train", "'" + s.trial.train + "' does not exist", file);
  if (s.space.empty() && s.objective.function.empty())
    issues.add(file, "space", "no parameters to tune");
  for (const auto& [name, p] : s.space) check_param(name, p, issues, file);
  const auto& ms = s.objective.metrics;
  for (size_t i = 0; i < ms.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (ms[i].metric == ms[j].metric)
        issues.add_at("objective.metrics[" + std::to_string(i) + "].metric",
                      "'" + ms[i].metric + "' is listed twice", file);
  if (ms.size() > 1 && (s.sampler.name == "gp"))
    issues.add_at("sampler.name",
                  "gp optimises one objective; with several use tpe (multi-objective TPE) or "
                  "random",
                  file);
}

}  // namespace

StudyFile load_study_file(const std::string& path, const std::vector<std::string>& overrides,
                          const StudyChecks& extra, bool in_folder) {
  Issues issues;
  const YAML::Node root = load_yaml_file(path, "study", "examples are in configs/tune/",
                                         "study:, sampler:, space:", issues);
  StudyFile s;
  // `objective: [{metric, direction}, ...]` is short for `objective: {metrics: [...]}`.
  YAML::Node doc = root;
  if (doc.IsMap() && doc["objective"] && doc["objective"].IsSequence()) {
    doc = YAML::Clone(root);
    YAML::Node m(YAML::NodeType::Map);
    m["metrics"] = root["objective"];
    doc["objective"] = m;
  }
  read_settings(doc, path, overrides, issues, s);
  // Every problem at once: the checks across settings run even when a field failed (they skip
  // what could not be read).
  cross_checks(s, issues, path, in_folder);
  if (extra) extra(s, issues);
  try {
    issues.throw_if_any();
  } catch (const ConfigError& e) {
    throw ConfigError(
        e.where(), e.message(),
        "see `mltrain config schema --study` for every key; examples are in configs/tune/");
  }
  return s;
}

std::string to_yaml(const StudyFile& s) { return yaml_of(s); }

std::string study_schema_text() { return schema_of<StudyFile>(); }

}  // namespace mltrain::config
