#pragma once
// One declaration per setting. A config struct lists its fields once, in visit():
//
//   struct OptimConfig {
//     std::string name = "sgd";
//     double lr = 0.1;
//     template <class V> void visit(V& v) {
//       v.field("name", name, "optimizer", one_of({"sgd", "adam", "adamw"}));
//       v.field("lr", lr, "base learning rate", positive<double>());
//     }
//   };
//
// Reading YAML (+ key=value overrides), writing the resolved YAML, and `mltrain config schema` are
// visitors over that one declaration (config/reader.hpp, config/writer.hpp), so parsing, checks,
// defaults and docs cannot drift apart.
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "mltrain/config/format.hpp"
#include "mltrain/config/period.hpp"

namespace mltrain::config {

// "auto" or a non-negative count (data.workers, runtime.threads).
struct Count {
  int64_t value = -1;  // -1 = auto
  bool is_auto() const { return value < 0; }
  int64_t resolve(int64_t automatic) const { return is_auto() ? automatic : value; }
  std::string str() const { return is_auto() ? "auto" : std::to_string(value); }
  static Count automatic() { return {}; }
  static Count of(int64_t n) { return {n}; }
};

// A sample count that may be `auto` (data.batch_size). It reads as its number everywhere, so
// `auto` (-1) must be resolved before use: build_pipeline resolves data.batch_size to
// train.global_batch / world, and the micro-batch to what fits runtime.memory_budget.
struct AutoSize {
  int64_t value = 0;
  AutoSize(int64_t v = 0) : value(v) {}  // NOLINT: a plain number is a size
  static AutoSize automatic() { return AutoSize(-1); }
  bool is_auto() const { return value < 0; }
  operator int64_t() const { return value; }  // NOLINT
  std::string str() const { return is_auto() ? "auto" : std::to_string(value); }
};

// One YAML scalar kept as written (a categorical choice: 64, 0.5, true or 'adam'); quoted: it was
// a quoted string in the file, so it stays a string.
struct Scalar {
  std::string text;
  bool quoted = false;
  bool operator==(const Scalar& o) const { return text == o.text && quoted == o.quoted; }
};

// A check returns "" when the value is acceptable, else what is wrong. desc is shown in the schema.
template <class T>
struct Check {
  std::string desc;
  std::function<std::string(const T&)> fn;
  std::string operator()(const T& v) const { return fn ? fn(v) : std::string(); }
};

template <class T>
Check<T> any() {
  return {"", nullptr};
}

template <class T>
Check<T> positive() {
  return {"> 0", [](const T& v) { return v > 0 ? "" : "must be > 0"; }};
}
template <class T>
Check<T> non_negative() {
  return {">= 0", [](const T& v) { return v >= 0 ? "" : "must be >= 0"; }};
}
// A fold count: 0 (off) or at least 2 (data.folds, a study's objective.folds).
inline Check<int64_t> fold_count() {
  return {"0 or >= 2",
          [](const int64_t& k) { return k == 0 || k >= 2 ? "" : "must be 0 (off) or at least 2"; }};
}

template <class T>
Check<T> in_range(T lo, T hi) {
  auto s = [](T x) {
    if constexpr (std::is_floating_point_v<T>)
      return format_double(x);
    else
      return std::to_string(x);
  };
  std::string d = "in [" + s(lo) + ", " + s(hi) + "]";
  return {d, [lo, hi, d](const T& v) { return (v >= lo && v <= hi) ? "" : "must be " + d; }};
}
inline Check<std::string> one_of(std::initializer_list<const char*> options) {
  std::vector<std::string> opts(options.begin(), options.end());
  std::string d = "one of";
  for (auto& o : opts) d += " " + o;
  return {d, [opts](const std::string& v) {
            for (auto& o : opts)
              if (o == v) return std::string();
            std::string list;
            for (auto& o : opts) list += (list.empty() ? "" : ", ") + o;
            return "'" + v + "' is not one of: " + list;
          }};
}
inline Check<std::vector<int64_t>> each_positive() {
  return {"each > 0", [](const std::vector<int64_t>& v) {
            for (auto x : v)
              if (x <= 0) return std::string("every entry must be > 0");
            return std::string();
          }};
}
// A tracking server's URI: empty (off) or http(s)://host[:port][/path] (tracking.mlflow.uri).
inline std::string tracking_uri_problem(const std::string& v) {
  if (v.empty()) return "";
  const size_t scheme = v.find("://");
  if (scheme == std::string::npos)
    return "'" + v + "' has no scheme: write http://" + v + " (or https://)";
  const std::string s = v.substr(0, scheme);
  if (s != "http" && s != "https")
    return "'" + v + "': only http:// and https:// servers are supported (MLflow's " + s +
           " stores are not)";
  if (v.size() == scheme + 3) return "'" + v + "' names no host";
  return "";
}
inline Check<std::string> tracking_uri() {
  return {"empty or http(s)://host[:port]", tracking_uri_problem};
}
inline Check<Count> positive_or_auto() {
  return {"> 0 or auto",
          [](const Count& c) { return c.is_auto() || c.value > 0 ? "" : "must be > 0 or auto"; }};
}
// "512MiB", "2GiB", "1.5GB", "800MB", "64KiB" or "none" (0) -> bytes; "" when it parses.
inline std::string parse_memory_size(const std::string& text, int64_t& bytes) {
  bytes = 0;
  if (text == "none") return "";
  static const std::pair<const char*, double> units[] = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12}};
  for (const auto& [u, scale] : units) {
    const std::string unit = u;
    if (text.size() <= unit.size() || text.compare(text.size() - unit.size(), unit.size(), unit))
      continue;
    const std::string num = text.substr(0, text.size() - unit.size());
    char* end = nullptr;
    const double v = std::strtod(num.c_str(), &end);
    if (!end || *end != 0 || !(v > 0) || v * scale > 9.0e18) break;
    bytes = static_cast<int64_t>(v * scale);
    return "";
  }
  return "'" + text + "' is not a size: write e.g. 512MiB, 2GiB, 1.5GB, or none";
}
inline Check<std::string> memory_size() {
  return {"a size (512MiB, 2GiB, 1.5GB) or none", [](const std::string& v) {
            int64_t b = 0;
            return parse_memory_size(v, b);
          }};
}
inline Check<AutoSize> positive_size_or_auto() {
  return {"> 0 or auto", [](const AutoSize& c) {
            return c.is_auto() || c.value > 0 ? "" : "must be > 0 or auto";
          }};
}
inline Check<Period> period_enabled() {
  return {"not never", [](const Period& p) {
            return p.enabled() ? "" : "must not be 'never' or 0: this setting cannot be off";
          }};
}

// Type names shown in the schema and in type errors.
template <class T>
const char* type_name();
template <>
inline const char* type_name<bool>() {
  return "bool";
}
template <>
inline const char* type_name<int64_t>() {
  return "int";
}
template <>
inline const char* type_name<double>() {
  return "float";
}
template <>
inline const char* type_name<std::string>() {
  return "string";
}
template <>
inline const char* type_name<std::vector<int64_t>>() {
  return "list of int";
}
template <>
inline const char* type_name<std::vector<double>>() {
  return "list of float";
}
template <>
inline const char* type_name<AutoSize>() {
  return "int or auto";
}
template <>
inline const char* type_name<Period>() {
  return "period (10ep | 500u | never)";
}
template <>
inline const char* type_name<Count>() {
  return "int | auto";
}
template <>
inline const char* type_name<std::vector<Period>>() {
  return "list of period";
}
template <>
inline const char* type_name<Duration>() {
  return "duration (90s | 30m | 2h | never)";
}
template <>
inline const char* type_name<Scalar>() {
  return "scalar";
}
template <>
inline const char* type_name<std::vector<std::string>>() {
  return "list of string";
}
template <>
inline const char* type_name<std::vector<Scalar>>() {
  return "list of scalar";
}

// Text form of a value, as print-config writes it and the schema shows it.
inline std::string to_text(bool v) { return v ? "true" : "false"; }
inline std::string to_text(int64_t v) { return std::to_string(v); }
inline std::string to_text(double v) { return format_double(v); }
inline std::string to_text(const std::string& v) { return yaml_quote(v); }
inline std::string to_text(const Period& v) { return v.str(); }
inline std::string to_text(const Count& v) { return v.str(); }
inline std::string to_text(const AutoSize& v) { return v.str(); }
inline std::string to_text(const Duration& v) { return v.str(); }
inline std::string to_text(const Scalar& v) { return v.quoted ? yaml_quote(v.text) : v.text; }
template <class T>
std::string to_text(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + to_text(v[i]);
  return s + "]";
}

// Edit distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b);
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace mltrain::config
