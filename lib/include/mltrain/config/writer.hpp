#pragma once
// Visitors that write a config struct: as YAML (print-config; reading it back and writing again
// gives the same bytes) and as the schema table (`mltrain config schema`).
//
//   YamlWriter w;  cfg.visit(w);  std::cout << w.text();
//   SchemaWriter s; ExperimentConfig{}.visit(s); std::cout << s.text();
#include <sstream>
#include <string>
#include <vector>

#include "mltrain/config/schema.hpp"

namespace mltrain::config {

class YamlWriter {
 public:
  explicit YamlWriter(int indent = 0, bool first_dash = false)
      : indent_(indent), dash_(first_dash) {}

  template <class T>
  void field(const char* key, T& value, const char*, const Check<T>& = {}) {
    line(std::string(key) + ": " + to_text(value));
  }
  template <class S>
  void section(const char* key, S& sub, const char*) {
    line(std::string(key) + ":");
    YamlWriter w(indent_ + 2);
    sub.visit(w);
    out_ << w.text();
  }
  template <class S>
  void list(const char* key, std::vector<S>& items, const char*) {
    if (items.empty()) {
      line(std::string(key) + ": []");
      return;
    }
    line(std::string(key) + ":");
    for (auto& item : items) {
      YamlWriter w(indent_ + 2, /*first_dash=*/true);
      item.visit(w);
      out_ << w.text();
    }
  }
  template <class S>
  void entries(const char* key, std::vector<std::pair<std::string, S>>& items, const char*) {
    if (items.empty()) {
      line(std::string(key) + ": {}");
      return;
    }
    line(std::string(key) + ":");
    YamlWriter w(indent_ + 2);  // each entry is a section named by its key
    for (auto& [name, item] : items) {
      const bool plain = !name.empty() &&
                         name.find_first_not_of(
                             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") ==
                             std::string::npos;
      w.section((plain ? name : yaml_quote(name)).c_str(), item, "");
    }
    out_ << w.text();
  }
  std::string text() const { return out_.str(); }

 private:
  void line(const std::string& s) {
    if (dash_) {
      out_ << std::string(indent_, ' ') << "- " << s << "\n";
      dash_ = false;
      indent_ += 2;
    } else {
      out_ << std::string(indent_, ' ') << s << "\n";
    }
  }
  int indent_;
  bool dash_;
  std::ostringstream out_;
};

struct SchemaRow {
  std::string path, type, default_value, doc, check;
};

class SchemaWriter {
 public:
  explicit SchemaWriter(std::string prefix = "") : prefix_(std::move(prefix)) {}
  template <class T>
  void field(const char* key, T& value, const char* doc, const Check<T>& check = {}) {
    rows_.push_back({prefix_ + key, type_name<T>(), to_text(value), doc, check.desc});
  }
  template <class S>
  void section(const char* key, S& sub, const char* doc) {
    rows_.push_back({prefix_ + key, "section", "", doc, ""});
    SchemaWriter w(prefix_ + key + ".");
    sub.visit(w);
    rows_.insert(rows_.end(), w.rows_.begin(), w.rows_.end());
  }
  template <class S>
  void list(const char* key, std::vector<S>&, const char* doc) {
    rows_.push_back({prefix_ + key, "list of mappings", "[]", doc, ""});
    S item;
    SchemaWriter w(prefix_ + key + "[].");
    item.visit(w);
    rows_.insert(rows_.end(), w.rows_.begin(), w.rows_.end());
  }
  template <class S>
  void entries(const char* key, std::vector<std::pair<std::string, S>>&, const char* doc) {
    rows_.push_back({prefix_ + key, "map of name -> mapping", "{}", doc, ""});
    S item;
    SchemaWriter w(prefix_ + key + ".<name>.");
    item.visit(w);
    rows_.insert(rows_.end(), w.rows_.begin(), w.rows_.end());
  }
  const std::vector<SchemaRow>& rows() const { return rows_; }
  std::string text() const;

 private:
  std::string prefix_;
  std::vector<SchemaRow> rows_;
};

// The two writers over any settings struct: its YAML (print-config, study.yaml) and its schema.
template <class S>
std::string yaml_of(const S& settings) {
  YamlWriter w;
  const_cast<S&>(settings).visit(w);  // visit() is shared with the reader, hence not const
  return w.text();
}
template <class S>
std::string schema_of() {
  S defaults;
  SchemaWriter w;
  defaults.visit(w);
  return w.text();
}

}  // namespace mltrain::config
