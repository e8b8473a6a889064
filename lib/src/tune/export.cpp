// `mltrain tune export --optuna-journal` (tune/export.hpp).
#include "mltrain/tune/export.hpp"

#include <cmath>
#include <ctime>

#include <nlohmann/json.hpp>

#include "mltrain/core/fs.hpp"
#include "mltrain/tune/analysis.hpp"
#include "mltrain/tune/study.hpp"

using nlohmann::json;

namespace mltrain::tune {

namespace {

constexpr const char* kWorker = "mltrain-export";
// Optuna's enums: StudyDirection and TrialState.
constexpr int kMinimize = 1, kMaximize = 2;
int optuna_state(const std::string& s) {
  if (s == "COMPLETE") return 1;
  if (s == "PRUNED") return 2;
  if (s == "FAIL") return 3;
  return 0;  // RUNNING
}

// Seconds since the epoch as Optuna writes datetimes: ISO 8601, microseconds, UTC offset.
std::string iso_utc(double t) {
  const auto secs = static_cast<std::time_t>(std::floor(t));
  const int micros = static_cast<int>(std::llround((t - std::floor(t)) * 1e6)) % 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06d+00:00", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, micros);
  return buf;
}

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// A parameter's distribution as optuna.distributions.distribution_to_json writes it (a string).
std::string distribution_json(const Param& p) {
  json attrs;
  std::string name;
  switch (p.kind) {
    case Param::Kind::Float:
      name = "FloatDistribution";
      attrs = {{"low", p.low},
               {"high", p.high},
               {"log", p.log},
               {"step", p.step > 0 ? json(p.step) : json(nullptr)}};
      break;
    case Param::Kind::Int:
      name = "IntDistribution";
      attrs = {{"low", static_cast<int64_t>(p.low)},
               {"high", static_cast<int64_t>(p.high)},
               {"log", p.log},
               {"step", static_cast<int64_t>(p.step > 0 ? p.step : 1)}};
      break;
    case Param::Kind::Categorical:
      name = "CategoricalDistribution";
      attrs = {{"choices", p.choices}};
      break;
  }
  return json{{"name", name}, {"attributes", attrs}}.dump();
}

}  // namespace

ExportReport export_optuna_journal(const std::string& study_dir, const std::string& out) {
  const StudyConfig cfg = study_config_from_folder(study_dir);
  const auto trials = read_trials(study_dir, cfg.space);
  std::string text;
  auto op = [&](int code, json fields) {
    fields["op_code"] = code;
    fields["worker_id"] = kWorker;
    text += fields.dump() + "\n";
  };
  json directions = json::array(), names = json::array();
  for (const auto& o : cfg.objectives) {
    directions.push_back(o.maximize ? kMaximize : kMinimize);
    names.push_back(o.metric);
  }
  op(0, {{"study_name", cfg.name()}, {"directions", directions}});
  op(3, {{"study_id", 0}, {"system_attr", {{"study:metric_names", names}}}});
  for (const auto& t : trials) {
    json distributions = json::object(), params = json::object();
    for (size_t i = 0; i < cfg.space.size() && i < t.x.size(); ++i) {
      if (!std::isfinite(t.x[i])) continue;  // a parameter the trial never got
      distributions[cfg.space[i].name] = distribution_json(cfg.space[i]);
      params[cfg.space[i].name] = t.x[i];  // the value itself; for a categorical, its index
    }
    json intermediate = json::object();
    for (const auto& [step, v] : t.intermediate)
      intermediate[std::to_string(step)] = finite_or_null(v);
    json user = t.attrs.is_object() ? t.attrs : json::object();
    user["mltrain_number"] = t.number;
    if (!t.reason.empty()) user["mltrain_reason"] = t.reason;
    json log = {{"study_id", 0},
                {"state", optuna_state(t.state)},
                {"datetime_start", t.started > 0 ? json(iso_utc(t.started)) : json(nullptr)},
                {"distributions", distributions},
                {"params", params},
                {"user_attrs", user},
                {"system_attrs", json::object()},
                {"intermediate_values", intermediate}};
    const bool finished = t.state != "RUNNING";
    if (finished && t.finished > 0) log["datetime_complete"] = iso_utc(t.finished);
    if (t.state == "FAIL" || t.state == "RUNNING") {
      log["value"] = nullptr;
      log["values"] = nullptr;
    } else if (cfg.multi()) {
      json values = json::array();
      for (double v : t.values) values.push_back(finite_or_null(v));
      log["value"] = nullptr;
      log["values"] = values;
    } else {
      log["value"] = finite_or_null(t.value);
      log["values"] = nullptr;
    }
    op(4, log);
  }
  write_file_atomic(out, text);
  return {cfg.name(), static_cast<int>(trials.size())};
}

}  // namespace mltrain::tune
