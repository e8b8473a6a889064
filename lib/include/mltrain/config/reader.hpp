#pragma once
// Reads a config struct from YAML plus `key.path=value` overrides, collecting every problem as
// "file:line:col: key.path: message" before anything runs.
//
//   Overrides ov = parse_overrides({"optim.lr=0.01"});
//   Issues issues;
//   ExperimentConfig cfg;
//   read_config(YAML::LoadFile(path), path, ov, issues, cfg);   // cfg.visit(reader)
//   issues.throw_if_any();                                     // ConfigError listing all of them
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "mltrain/config/schema.hpp"
#include "mltrain/core/error.hpp"

namespace mltrain::config {

struct Issue {
  std::string origin;  // "file:line:col" or "override 'k=v'"
  std::string path;    // dotted key path
  std::string message;
};

class Issues {
 public:
  void add(std::string origin, std::string path, std::string message) {
    list_.push_back({std::move(origin), std::move(path), std::move(message)});
  }
  // Where each setting was read (path -> "file:line:col"), so checks across settings made after
  // reading still point at the line: add_at("space.lr.low", ...) names the line of space.lr.low.
  void note_origin(const std::string& path, std::string origin) {
    origins_[path] = std::move(origin);
  }
  void add_at(const std::string& path, std::string message, const std::string& fallback_origin) {
    auto it = origins_.find(path);
    add(it != origins_.end() ? it->second : fallback_origin, path, std::move(message));
  }
  bool has_origin(const std::string& path) const { return origins_.count(path) > 0; }
  // Whether a problem was already reported at `path` or below it (checks across settings skip
  // what could not be read, instead of piling a second message on the first).
  bool any_under(const std::string& path) const {
    for (const auto& i : list_)
      if (i.path == path || i.path.rfind(path + ".", 0) == 0) return true;
    return false;
  }
  bool empty() const { return list_.empty(); }
  const std::vector<Issue>& list() const { return list_; }
  std::string text() const;
  void throw_if_any() const;  // ConfigError whose message lists every issue, one per line

 private:
  std::vector<Issue> list_;
  std::map<std::string, std::string> origins_;
};

struct Override {
  std::string text;  // as typed: "optim.lr=0.01"
  YAML::Node value;
  bool used = false;
};
using Overrides = std::map<std::string, Override>;

// Parses "a.b=value" items; the value is read as YAML ("[1, 2]", "true", "0.1", "10ep").
// Malformed items are added to issues.
Overrides parse_overrides(const std::vector<std::string>& items, Issues& issues);

std::string mark_text(const std::string& file, const YAML::Mark& m);

// Decoders: "" on success, else the reason.
std::string decode(const YAML::Node& n, bool& out);
std::string decode(const YAML::Node& n, int64_t& out);
std::string decode(const YAML::Node& n, double& out);
std::string decode(const YAML::Node& n, std::string& out);
std::string decode(const YAML::Node& n, Period& out);
std::string decode(const YAML::Node& n, Count& out);
std::string decode(const YAML::Node& n, AutoSize& out);
std::string decode(const YAML::Node& n, std::vector<int64_t>& out);
std::string decode(const YAML::Node& n, std::vector<double>& out);
std::string decode(const YAML::Node& n, std::vector<Period>& out);
std::string decode(const YAML::Node& n, Duration& out);
std::string decode(const YAML::Node& n, Scalar& out);
std::string decode(const YAML::Node& n, std::vector<std::string>& out);
std::string decode(const YAML::Node& n, std::vector<Scalar>& out);

class Reader {
 public:
  Reader(YAML::Node node, std::string file, std::string prefix, Overrides& ov, Issues& issues,
         std::vector<std::string>& declared)
      : node_(std::move(node)),
        file_(std::move(file)),
        prefix_(std::move(prefix)),
        ov_(ov),
        issues_(issues),
        declared_(declared) {}

  template <class T>
  void field(const char* key, T& value, const char* /*doc*/, const Check<T>& check = {}) {
    const std::string path = prefix_ + key;
    declared_.push_back(path);
    keys_.push_back(key);
    std::string origin;
    YAML::Node n;
    auto it = ov_.find(path);
    if (it != ov_.end()) {
      it->second.used = true;
      origin = "override '" + it->second.text + "'";
      n = it->second.value;
    } else if (node_.IsMap() && node_[key]) {
      n = node_[key];
      origin = mark_text(file_, n.Mark());
    } else {
      return;  // default stays
    }
    issues_.note_origin(path, origin);
    std::string err = decode(n, value);
    if (err.empty()) err = check(value);
    if (!err.empty()) issues_.add(origin, path, err);
  }

  template <class S>
  void section(const char* key, S& sub, const char* /*doc*/) {
    keys_.push_back(key);
    YAML::Node child;
    if (node_.IsMap() && node_[key]) {
      child = node_[key];
      if (!child.IsMap() && !child.IsNull()) {
        issues_.add(mark_text(file_, child.Mark()), prefix_ + key,
                    "expected a mapping of settings (key: value lines indented below it)");
        child = YAML::Node();
      }
    }
    Reader r(child, file_, prefix_ + key + ".", ov_, issues_, declared_);
    sub.visit(r);
    r.finish();
  }

  template <class S>
  void list(const char* key, std::vector<S>& items, const char* /*doc*/) {
    const std::string path = prefix_ + key;
    declared_.push_back(path);
    keys_.push_back(key);
    YAML::Node n;
    std::string file = file_;
    auto it = ov_.find(path);
    if (it != ov_.end()) {
      it->second.used = true;
      n = it->second.value;
      file = "override '" + it->second.text + "'";
    } else if (node_.IsMap() && node_[key]) {
      n = node_[key];
    } else {
      return;
    }
    if (!n.IsSequence()) {
      issues_.add(mark_text(file, n.Mark()), path, "expected a list (- item lines or [..])");
      return;
    }
    items.clear();
    for (size_t i = 0; i < n.size(); ++i) {
      S item;
      Overrides none;
      std::vector<std::string> sink;
      Reader r(n[i], file, path + "[" + std::to_string(i) + "].", none, issues_, sink);
      if (!n[i].IsMap())
        issues_.add(mark_text(file, n[i].Mark()), path + "[" + std::to_string(i) + "]",
                    "expected a mapping");
      item.visit(r);
      r.finish();
      items.push_back(item);
    }
  }

  // A mapping of user-chosen names to settings structs (tune's `space: {optim.lr: {...}}`), in
  // file order. Names may contain dots, so entries take no key=value overrides.
  template <class S>
  void entries(const char* key, std::vector<std::pair<std::string, S>>& items,
               const char* /*doc*/) {
    const std::string path = prefix_ + key;
    declared_.push_back(path);
    keys_.push_back(key);
    if (!node_.IsMap() || !node_[key]) return;
    const YAML::Node n = node_[key];
    if (!n.IsMap()) {
      issues_.add(mark_text(file_, n.Mark()), path,
                  "expected a mapping of names to settings (name: {key: value, ...})");
      return;
    }
    items.clear();
    std::vector<std::string> names;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const std::string name = it->first.Scalar();
      const std::string at = path + "." + name;
      if (std::find(names.begin(), names.end(), name) != names.end()) {
        issues_.add(mark_text(file_, it->first.Mark()), at,
                    "duplicate name; YAML would silently keep one of them");
        continue;
      }
      names.push_back(name);
      issues_.note_origin(at, mark_text(file_, it->first.Mark()));
      S item;
      Overrides none;
      std::vector<std::string> sink;
      if (!it->second.IsMap())
        issues_.add(mark_text(file_, it->second.Mark()), at, "expected a mapping of settings");
      Reader r(it->second.IsMap() ? it->second : YAML::Node(), file_, at + ".", none, issues_,
               sink);
      item.visit(r);
      r.finish();
      items.emplace_back(name, item);
    }
  }

  // Unknown and duplicate keys at this level.
  void finish();

 private:
  YAML::Node node_;
  std::string file_, prefix_;
  Overrides& ov_;
  Issues& issues_;
  std::vector<std::string>& declared_;
  std::vector<std::string> keys_;
};

// A config file as YAML: ConfigError (exit 2) when it is missing, unreadable or not YAML, naming
// the file (and line) and a fix; a top level that is not a mapping is added to issues.
//   kind: "config" or "study" (in the messages); examples: where example files live;
//   top_keys: the first sections, shown in the mapping hint ("run:, data:, model:").
YAML::Node load_yaml_file(const std::string& path, const std::string& kind,
                          const std::string& examples, const std::string& top_keys, Issues& issues);

// Reads `root` plus key=value overrides into a settings struct through its visit(), collecting
// every problem; an override no field consumed is an unknown key with a did-you-mean.
template <class S>
void read_settings(const YAML::Node& root, const std::string& file,
                   const std::vector<std::string>& overrides, Issues& issues, S& out) {
  Overrides ov = parse_overrides(overrides, issues);
  std::vector<std::string> declared;
  Reader reader(root, file, "", ov, issues, declared);
  out.visit(reader);
  reader.finish();
  for (auto& [key, o] : ov) {
    if (o.used) continue;
    const std::string hint = did_you_mean(key, declared);
    issues.add("override '" + o.text + "'", key,
               "unknown key" + (hint.empty() ? std::string() : " (did you mean '" + hint + "'?)"));
  }
}

}  // namespace mltrain::config
