// Reading a study YAML (`mltrain tune STUDY.yaml [key.path=value ...]`).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <thread>

#include "mltrain/config/format.hpp"
#include "mltrain/config/reader.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/tune/functions.hpp"
#include "mltrain/tune/study.hpp"

namespace mltrain::tune {
namespace {

using config::Issues;

nlohmann::json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: {
      auto a = nlohmann::json::array();
      for (const auto& e : n) a.push_back(yaml_to_json(e));
      return a;
    }
    case YAML::NodeType::Map: {
      auto o = nlohmann::json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return o;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted in the file: a string
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      // Numbers only when they look like one ("nan", "inf" and "infinity" stay strings).
      const bool numeric_start = !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+' || s[0] == '.') &&
                                 s.find_first_of("nNiI") == std::string::npos;
      if (!numeric_start) return s;
      try {
        size_t pos = 0;
        const long long i = std::stoll(s, &pos);
        if (pos == s.size()) return i;
      } catch (...) {
      }
      try {
        size_t pos = 0;
        const double d = std::stod(s, &pos);
        if (pos == s.size()) return d;
      } catch (...) {
      }
      return s;
    }
    default: return nullptr;
  }
}

// A section of the study file with its known keys; unknown keys are issues with their position.
struct Section {
  YAML::Node node;
  std::string file, prefix;
  config::Overrides& ov;
  Issues& issues;
  std::set<std::string> known;

  // A null node when the key is absent (callers test IsNull; an explicit `key: null` reads as absent).
  YAML::Node get(const std::string& key, std::string& origin) {
    known.insert(key);
    const auto it = ov.find(prefix + key);
    if (it != ov.end()) {
      it->second.used = true;
      origin = "override '" + it->second.text + "'";
      return it->second.value;
    }
    const YAML::Node& cn = node;  // const access: operator[] on a non-const node inserts the key
    if (cn && cn.IsMap() && cn[key]) {
      origin = config::mark_text(file, cn[key].Mark());
      return cn[key];
    }
    return YAML::Node();
  }
  template <class T>
  void read(const std::string& key, T& out, const std::function<std::string(const T&)>& check = {}) {
    std::string origin;
    const auto n = get(key, origin);
    if (!n || n.IsNull()) return;
    T v{};
    std::string why = config::decode(n, v);
    if (why.empty() && check) why = check(v);
    if (!why.empty()) issues.add(origin, prefix + key, why);
    else out = v;
  }
  void read_int(const std::string& key, int& out, int64_t lo) {
    int64_t v = out;
    read<int64_t>(key, v, [&](const int64_t& x) { return x < lo ? "must be >= " + std::to_string(lo) : std::string(); });
    out = int(v);
  }
  void read_bool(const std::string& key, bool& out) { read<bool>(key, out); }
  void finish() {
    if (!node || !node.IsMap()) return;
    for (const auto& kv : node) {
      const auto k = kv.first.as<std::string>();
      if (!known.count(k)) {
        std::string all;
        for (const auto& s : known) all += (all.empty() ? "" : " ") + s;
        issues.add(config::mark_text(file, kv.first.Mark()), prefix + k, "unknown key; valid keys here: " + all);
      }
    }
  }
};

std::string one_of(const std::string& v, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (v == o) return "";
  std::string s;
  for (const char* o : options) s += std::string(s.empty() ? "" : ", ") + o;
  return "'" + v + "' is not one of: " + s;
}

Param read_param(const std::string& name, const YAML::Node n, const std::string& file, Issues& issues) {
  const std::string where = config::mark_text(file, n.Mark());
  const std::string path = "space." + name;
  if (!n.IsMap()) {
    issues.add(where, path, "expected a map like {type: float, low: 1e-4, high: 0.1, log: true}");
    return {};
  }
  std::set<std::string> known = {"type", "low", "high", "log", "step", "choices", "grid"};
  for (const auto& kv : n)
    if (!known.count(kv.first.as<std::string>()))
      issues.add(config::mark_text(file, kv.first.Mark()), path + "." + kv.first.as<std::string>(),
                 "unknown key; valid keys here: choices grid high log low step type");
  const std::string type = n["type"] ? n["type"].as<std::string>() : "";
  auto num = [&](const char* k, double& out) {
    if (!n[k]) return false;
    const auto why = config::decode(n[k], out);
    if (!why.empty()) issues.add(config::mark_text(file, n[k].Mark()), path + "." + k, why);
    return why.empty();
  };
  Param p;
  if (type == "categorical") {
    if (!n["choices"] || !n["choices"].IsSequence() || n["choices"].size() == 0) {
      issues.add(where, path + ".choices", "a categorical parameter needs a non-empty list of choices");
      return {};
    }
    std::vector<nlohmann::json> ch;
    for (const auto& c : n["choices"]) ch.push_back(yaml_to_json(c));
    return Param::categorical(name, ch);
  }
  if (type != "float" && type != "int") {
    issues.add(where, path + ".type", type.empty() ? "missing; use float, int or categorical" : one_of(type, {"float", "int", "categorical"}));
    return {};
  }
  double lo = 0, hi = 0, step = 0;
  bool log = false;
  if (!num("low", lo) || !num("high", hi)) {
    if (!n["low"] || !n["high"]) issues.add(where, path, "needs low and high");
    return {};
  }
  num("step", step);
  if (n["log"]) {
    const auto why = config::decode(n["log"], log);
    if (!why.empty()) issues.add(config::mark_text(file, n["log"].Mark()), path + ".log", why);
  }
  if (!(lo < hi)) issues.add(where, path, "low must be below high (" + config::format_double(lo) + " >= " + config::format_double(hi) + ")");
  if (log && lo <= 0) issues.add(where, path + ".low", "a log-scaled parameter needs low > 0");
  if (log && step > 0 && type == "float") issues.add(where, path, "log and step cannot be combined");
  if (type == "int") {
    if (lo != std::floor(lo) || hi != std::floor(hi)) issues.add(where, path, "an int parameter needs integer low and high");
    p = Param::integer(name, int64_t(lo), int64_t(hi), log, step > 0 ? int64_t(step) : 1);
  } else {
    p = Param::floating(name, lo, hi, log, step);
  }
  if (n["grid"]) {
    std::vector<double> g;
    const auto why = config::decode(n["grid"], g);
    if (!why.empty()) issues.add(config::mark_text(file, n["grid"].Mark()), path + ".grid", why);
    for (double v : g)
      if (v < lo || v > hi) issues.add(config::mark_text(file, n["grid"].Mark()), path + ".grid", "value " + config::format_double(v) + " is outside [low, high]");
    p.grid = g;
  }
  return p;
}

}  // namespace

StudyConfig load_study_config(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node loaded;
  try {
    loaded = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw ConfigError(path, "cannot read the study file", "check the path; examples are in configs/tune_*.yaml");
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1), "YAML syntax: " + e.msg);
  }
  const YAML::Node root = loaded;  // const: operator[] must not insert missing sections
  Issues issues;
  auto ov = config::parse_overrides(overrides, issues);
  StudyConfig c;
  c.source = path;
  std::set<std::string> sections = {"study", "sampler", "pruner", "objective", "trial", "space"};
  if (root && root.IsMap())
    for (const auto& kv : root)
      if (!sections.count(kv.first.as<std::string>()))
        issues.add(config::mark_text(path, kv.first.Mark()), kv.first.as<std::string>(), "unknown section; valid: objective pruner sampler space study trial");

  Section st{root["study"], path, "study.", ov, issues, {}};
  st.read<std::string>("name", c.name, [](const std::string& s) {
    return s.empty() || s.find('/') != std::string::npos ? "must be a non-empty name without '/'" : "";
  });
  st.read<std::string>("dir", c.dir);
  int64_t seed = 0;
  st.read<int64_t>("seed", seed, [](const int64_t& v) { return v < 0 ? "must be >= 0" : ""; });
  c.seed = uint64_t(seed);
  st.read_int("n_trials", c.n_trials, 1);
  config::Period timeout;
  {
    std::string origin;
    auto n = st.get("timeout", origin);
    if (n && !n.IsNull()) {
      double s = 0;
      std::string txt = n.Scalar();
      char unit = txt.empty() ? 's' : txt.back();
      double mult = unit == 'h' ? 3600 : unit == 'm' ? 60 : 1;
      try {
        s = std::stod(std::isdigit(static_cast<unsigned char>(unit)) ? txt : txt.substr(0, txt.size() - 1)) * mult;
        if (s < 0 || (!std::isdigit(static_cast<unsigned char>(unit)) && unit != 's' && unit != 'm' && unit != 'h')) throw 1;
        c.timeout_s = s;
      } catch (...) {
        issues.add(origin, "study.timeout", "'" + txt + "' is not a duration; use seconds or 30m / 2h");
      }
    }
  }
  st.read_int("max_concurrent", c.max_concurrent, 1);
  st.read_int("max_retry", c.max_retry, 0);
  st.read<double>("heartbeat_s", c.heartbeat_s, [](const double& v) { return v <= 0 ? "must be > 0" : ""; });
  st.read<double>("stale_after_s", c.stale_after_s, [](const double& v) { return v <= 0 ? "must be > 0" : ""; });
  st.finish();

  Section sa{root["sampler"], path, "sampler.", ov, issues, {}};
  sa.read<std::string>("name", c.sampler.name, [](const std::string& v) { return one_of(v, {"grid", "random", "tpe", "gp"}); });
  sa.read_int("n_startup", c.sampler.n_startup, 0);
  sa.read_bool("multivariate", c.sampler.multivariate);
  sa.read_int("n_candidates", c.sampler.n_candidates, 1);
  sa.read<double>("gamma", c.sampler.gamma, [](const double& v) { return v <= 0 || v >= 1 ? "must be in (0, 1)" : ""; });
  sa.read<double>("xi", c.sampler.xi);
  sa.finish();

  Section pr{root["pruner"], path, "pruner.", ov, issues, {}};
  pr.read<std::string>("name", c.pruner.name, [](const std::string& v) { return one_of(v, {"none", "median", "percentile", "asha", "hyperband"}); });
  pr.read_int("n_startup_trials", c.pruner.n_startup_trials, 0);
  pr.read_int("n_warmup_steps", c.pruner.n_warmup_steps, 0);
  pr.read<double>("percentile", c.pruner.percentile, [](const double& v) { return v < 0 || v > 100 ? "must be in [0, 100]" : ""; });
  pr.read_int("min_resource", c.pruner.min_resource, 1);
  pr.read_int("max_resource", c.pruner.max_resource, 0);
  pr.read_int("reduction_factor", c.pruner.reduction_factor, 2);
  pr.finish();

  Section ob{root["objective"], path, "objective.", ov, issues, {}};
  ob.read<std::string>("metric", c.metric);
  std::string direction = "maximize";
  ob.read<std::string>("direction", direction, [](const std::string& v) { return one_of(v, {"maximize", "minimize"}); });
  c.maximize = direction == "maximize";
  ob.read<std::string>("function", c.function, [](const std::string& v) {
    if (find_test_function(v)) return std::string();
    std::string all;
    for (const auto& n : test_function_names()) all += (all.empty() ? "" : ", ") + n;
    return "unknown test function '" + v + "' (have: " + all + ")";
  });
  ob.finish();

  Section tr{root["trial"], path, "trial.", ov, issues, {}};
  tr.read<std::string>("train", c.train_config);
  {
    std::string origin;
    for (const char* key : {"overrides", "command"}) {
      auto n = tr.get(key, origin);
      if (!n || n.IsNull()) continue;
      if (!n.IsSequence()) {
        issues.add(origin, std::string("trial.") + key, "expected a list of strings");
        continue;
      }
      auto& out = std::string(key) == "overrides" ? c.overrides : c.command;
      for (const auto& e : n) out.push_back(e.as<std::string>());
    }
  }
  tr.read_int("threads", c.threads, 0);
  tr.finish();
  const int kinds = !c.function.empty() + !c.train_config.empty() + !c.command.empty();
  if (kinds != 1)
    issues.add(path, kinds == 0 ? "objective" : "trial",
               kinds == 0 ? "nothing to tune: set trial.train (a config for mltrain train), trial.command, or objective.function"
                          : "choose one of trial.train, trial.command and objective.function");
  if (!c.train_config.empty() && !std::filesystem::exists(c.train_config))
    issues.add(path, "trial.train", "'" + c.train_config + "' does not exist");
  if (!c.function.empty()) {
    c.space = find_test_function(c.function)->space;
    c.maximize = false;
    c.metric = "value";
  }

  const auto space = root["space"];
  if (space && space.IsMap()) {
    c.space.clear();
    for (const auto& kv : space) c.space.push_back(read_param(kv.first.as<std::string>(), kv.second, path, issues));
  } else if (space) {
    issues.add(config::mark_text(path, space.Mark()), "space", "expected a map of parameter name -> {type, low, high, ...}");
  }
  if (c.space.empty() && c.function.empty()) issues.add(path, "space", "no parameters to tune");
  for (const auto& [k, o] : ov)
    if (!o.used) issues.add("override '" + o.text + "'", k, "unknown key");
  if (issues.empty()) {
    try {
      make_sampler(c.sampler, c.space);
    } catch (const std::invalid_argument& e) {
      issues.add(path, "sampler.name", e.what());
    }
  }
  try {
    issues.throw_if_any();
  } catch (const ConfigError& e) {
    throw ConfigError(e.where(), e.message(), "every section and key is shown in configs/tune/*.yaml and docs/TUNE.md");
  }
  if (c.threads == 0) c.threads = std::max(1, int(std::thread::hardware_concurrency()) / c.max_concurrent);

  auto& r = c.resolved;
  r["study"] = {{"name", c.name}, {"dir", c.dir}, {"seed", c.seed}, {"n_trials", c.n_trials}, {"timeout_s", c.timeout_s},
                {"max_concurrent", c.max_concurrent}, {"max_retry", c.max_retry}};
  r["sampler"] = {{"name", c.sampler.name}, {"n_startup", c.sampler.n_startup}, {"multivariate", c.sampler.multivariate},
                  {"n_candidates", c.sampler.n_candidates}, {"gamma", c.sampler.gamma}};
  r["pruner"] = {{"name", c.pruner.name}, {"n_startup_trials", c.pruner.n_startup_trials}, {"n_warmup_steps", c.pruner.n_warmup_steps},
                 {"percentile", c.pruner.percentile}, {"min_resource", c.pruner.min_resource}, {"max_resource", c.pruner.max_resource},
                 {"reduction_factor", c.pruner.reduction_factor}};
  r["objective"] = {{"metric", c.metric}, {"direction", c.maximize ? "maximize" : "minimize"}, {"function", c.function}};
  r["trial"] = {{"train", c.train_config}, {"overrides", c.overrides}, {"command", c.command}};
  auto sp = nlohmann::json::object();
  for (const auto& p : c.space) {
    nlohmann::json j = {{"type", p.kind == Param::Kind::Float ? "float" : p.kind == Param::Kind::Int ? "int" : "categorical"}};
    if (p.numeric()) j["low"] = p.low, j["high"] = p.high, j["log"] = p.log, j["step"] = p.step;
    else j["choices"] = p.choices;
    if (!p.grid.empty()) j["grid"] = p.grid;
    sp[p.name] = j;
  }
  r["space"] = sp;
  return c;
}

}  // namespace mltrain::tune
