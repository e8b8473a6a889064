// A study file as the tuner runs it: the schema's StudyFile (config/study.hpp) turned into the
// driver's StudyConfig, with the tuner's own checks (test functions, the sampler against the space)
// reported with the schema's.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "mltrain/config/reader.hpp"
#include "mltrain/config/study.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/tune/analysis.hpp"
#include "mltrain/tune/functions.hpp"
#include "mltrain/tune/study.hpp"

namespace fs = std::filesystem;

namespace mltrain::tune {
namespace {

// A categorical choice as JSON: true/false, a number when it reads as one, else a string ("nan",
// "inf" and quoted scalars stay strings).
nlohmann::json scalar_json(const config::Scalar& c) {
  const std::string& s = c.text;
  if (c.quoted) return s;
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  const bool numeric_start = !s.empty() &&
                             (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' ||
                              s[0] == '+' || s[0] == '.') &&
                             s.find_first_of("nNiI") == std::string::npos;
  if (!numeric_start) return s;
  try {
    size_t pos = 0;
    const long long i = std::stoll(s, &pos);
    if (pos == s.size()) return i;
  } catch (const std::exception&) {
  }
  try {
    size_t pos = 0;
    const double d = std::stod(s, &pos);
    if (pos == s.size()) return d;
  } catch (const std::exception&) {
  }
  return s;
}

Param to_param(const std::string& name, const config::ParamSettings& p) {
  if (p.type == "categorical") {
    std::vector<nlohmann::json> choices;
    for (const auto& c : p.choices) choices.push_back(scalar_json(c));
    return Param::categorical(name, choices);
  }
  Param q = p.type == "int" ? Param::integer(name, int64_t(p.low), int64_t(p.high), p.log,
                                             p.step > 0 ? int64_t(p.step) : 1)
                            : Param::floating(name, p.low, p.high, p.log, p.step);
  q.grid = p.grid;
  return q;
}

// The schema's form of a space the tuner holds (a test function's), for the resolved study.yaml.
config::ParamSettings to_settings(const Param& p) {
  config::ParamSettings s;
  s.type = p.kind == Param::Kind::Float ? "float"
           : p.kind == Param::Kind::Int ? "int"
                                        : "categorical";
  if (p.numeric()) {
    s.low = p.low, s.high = p.high, s.log = p.log, s.step = p.step, s.grid = p.grid;
  } else {
    for (const auto& c : p.choices)
      s.choices.push_back({c.is_string() ? c.get<std::string>() : c.dump(), c.is_string()});
  }
  return s;
}

// The tuner's checks, in the same report as the schema's.
void tuner_checks(const config::StudyFile& f, config::Issues& issues) {
  if (!f.objective.function.empty() && !find_test_function(f.objective.function)) {
    std::string all;
    for (const auto& n : test_function_names()) all += (all.empty() ? "" : ", ") + n;
    issues.add_at("objective.function",
                  "unknown test function '" + f.objective.function + "' (have: " + all + ")", "");
    return;
  }
  if (const auto* fn = find_test_function(f.objective.function);
      fn && fn->n_objectives > 1 && f.sampler.name == "gp")
    issues.add_at("sampler.name",
                  "gp optimises one objective; " + f.objective.function +
                      " has several: use tpe (multi-objective TPE) or random",
                  "");
  if (f.objective.folds > 0 && !f.objective.function.empty())
    issues.add_at("objective.folds", "a test function has no data to cut into folds", "");
  if (issues.any_under("space") || issues.any_under("sampler"))
    return;  // a broken space fits no sampler
  Space space;
  for (const auto& [name, p] : f.space) space.push_back(to_param(name, p));
  if (space.empty() && !f.objective.function.empty())
    space = find_test_function(f.objective.function)->space;
  SamplerOptions so;
  so.name = f.sampler.name;
  try {
    make_sampler(so, space);
  } catch (const std::invalid_argument& e) {
    issues.add_at("sampler.name", e.what(), "");
  }
}

StudyConfig from_file(const config::StudyFile& f, const std::string& source) {
  StudyConfig c;
  c.source = source;
  c.file = f;
  static_cast<config::SamplerSettings&>(c.sampler) = f.sampler;  // declared once, in the schema
  c.pruner = f.pruner;
  for (const auto& m : f.objective.metrics)
    c.objectives.push_back({m.metric, m.direction == "maximize"});
  if (c.objectives.empty())
    c.objectives.push_back({f.objective.metric, f.objective.direction == "maximize"});
  c.metric = c.objectives[0].metric, c.maximize = c.objectives[0].maximize;
  for (const auto& [name, p] : f.space) c.space.push_back(to_param(name, p));
  if (!c.function().empty()) {  // a test function is minimised, over its own space unless given
    c.maximize = false;
    c.metric = "value";
    c.file.objective.direction = "minimize";
    c.file.objective.metric = "value";
    c.objectives = {{"value", false}};
    const auto* fn = find_test_function(c.function());
    if (fn->n_objectives > 1) {
      c.objectives.clear();
      c.file.objective.metrics.clear();
      for (int i = 1; i <= fn->n_objectives; ++i) {
        c.objectives.push_back({"f" + std::to_string(i), false});
        c.file.objective.metrics.push_back({"f" + std::to_string(i), "minimize"});
      }
      c.metric = "f1";
      c.file.objective.metric = "f1";
    }
    if (c.space.empty()) {
      c.space = fn->space;
      for (const auto& p : c.space) c.file.space.emplace_back(p.name, to_settings(p));
    }
  }
  return c;
}

}  // namespace

StudyConfig load_study_config(const std::string& path, const std::vector<std::string>& overrides) {
  StudyConfig c = from_file(config::load_study_file(path, overrides, tuner_checks), path);
  if (c.file.trial.threads == 0)  // per trial: the cores shared by the concurrent trials
    c.file.trial.threads =
        std::max(1, int(std::thread::hardware_concurrency()) / c.max_concurrent());
  return c;
}

StudyConfig study_config_from_folder(const std::string& dir) {
  const fs::path p = fs::path(dir) / "study.yaml";
  if (!fs::exists(p)) {
    const bool old = fs::exists(fs::path(dir) / "study.json");
    throw DataError(dir,
                    old ? "was written by an older mltrain (study.json, no study.yaml)"
                        : "is not a study folder (no study.yaml)",
                    old ? "rerun the study's `mltrain tune` command in a new study.dir"
                        : "pass the folder `mltrain tune` wrote, e.g. runs/tune/<name>");
  }
  return from_file(config::load_study_file(p.string(), {}, nullptr, /*in_folder=*/true),
                   p.string());
}

}  // namespace mltrain::tune
