#include "mltrain/config/reader.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "mltrain/config/writer.hpp"

namespace mltrain::config {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string mark_text(const std::string& file, const YAML::Mark& m) {
  if (file.rfind("override", 0) == 0) return file;
  if (m.is_null()) return file;
  return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

YAML::Node load_yaml_file(const std::string& path, const std::string& kind,
                          const std::string& examples, const std::string& top_keys,
                          Issues& issues) {
  if (!std::filesystem::exists(path))
    throw ConfigError(path, kind + " file not found", "check the path (" + examples + ")");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(mark_text(path, e.mark), "not valid YAML: " + e.msg,
                      "fix the syntax at that line (indentation, a missing ':' or quote)");
  } catch (const YAML::BadFile&) {
    throw ConfigError(path, "cannot read the " + kind + " file", "check its permissions");
  }
  if (!root.IsMap() && !root.IsNull()) {
    issues.add(mark_text(path, root.Mark()), "",
               "the top level must be a mapping (" + top_keys + " ...)");
    root = YAML::Node();
  }
  return root;
}

std::string Issues::text() const {
  std::string s;
  for (const auto& i : list_) {
    s += i.origin.empty() ? "" : i.origin + ": ";
    s += i.path.empty() ? "" : i.path + ": ";
    s += i.message + "\n";
  }
  return s;
}

void Issues::throw_if_any() const {
  if (list_.empty()) return;
  std::string msg = std::to_string(list_.size()) + " config error" + (list_.size() > 1 ? "s" : "") +
                    ":\n" + text();
  msg.pop_back();
  throw ConfigError("", msg, "see `mltrain config schema` for every key, its type and default");
}

Overrides parse_overrides(const std::vector<std::string>& items, Issues& issues) {
  Overrides ov;
  for (const auto& item : items) {
    const auto eq = item.find('=');
    const std::string origin = "override '" + item + "'";
    if (eq == std::string::npos || eq == 0) {
      issues.add(origin, "", "expected key.path=value (e.g. optim.lr=0.01)");
      continue;
    }
    const std::string path = item.substr(0, eq), text = item.substr(eq + 1);
    bool ok_path = true;
    for (char c : path)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) ok_path = false;
    if (!ok_path || path.front() == '.' || path.back() == '.' ||
        path.find("..") != std::string::npos) {
      issues.add(origin, path, "malformed key path (letters, digits, _ and single dots)");
      continue;
    }
    try {
      YAML::Node v = text.empty() ? YAML::Node(std::string()) : YAML::Load(text);
      ov[path] = {item, v, false};  // given twice: the later one wins, as with flags
    } catch (const YAML::Exception& e) {
      issues.add(origin, path, "value is not valid YAML: " + e.msg);
    }
  }
  return ov;
}

static std::string scalar_or_err(const YAML::Node& n, std::string& s, const char* want) {
  if (!n.IsScalar())
    return std::string("expected ") + want + ", got a " +
           (n.IsMap()        ? "mapping"
            : n.IsSequence() ? "list"
                             : "null value");
  s = n.Scalar();
  return "";
}

std::string decode(const YAML::Node& n, bool& out) {
  std::string s;
  if (auto e = scalar_or_err(n, s, "true or false"); !e.empty()) return e;
  if (s == "true" || s == "True" || s == "TRUE") return out = true, "";
  if (s == "false" || s == "False" || s == "FALSE") return out = false, "";
  return "expected true or false, got '" + s + "'";
}

std::string decode(const YAML::Node& n, int64_t& out) {
  std::string s;
  if (auto e = scalar_or_err(n, s, "an integer"); !e.empty()) return e;
  int64_t v = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), v);
  if (res.ec == std::errc::result_out_of_range) return "integer '" + s + "' is out of range";
  if (res.ec != std::errc() || res.ptr != s.data() + s.size())
    return "expected an integer, got '" + s + "'";
  out = v;
  return "";
}

std::string decode(const YAML::Node& n, double& out) {
  std::string s;
  if (auto e = scalar_or_err(n, s, "a number"); !e.empty()) return e;
  if (s == ".inf" || s == "inf") return out = INFINITY, "";
  if (s == "-.inf" || s == "-inf") return out = -INFINITY, "";
  if (s == ".nan" || s == ".NaN" || s == "nan")
    return out = NAN, "";  // "off" for optional thresholds
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || std::isnan(v))
    return "expected a number, got '" + s + "'";
  out = v;
  return "";
}

std::string decode(const YAML::Node& n, std::string& out) {
  std::string s;
  if (n.IsNull()) return "expected a string, got a null value";
  if (auto e = scalar_or_err(n, s, "a string"); !e.empty()) return e;
  out = s;
  return "";
}

std::string decode(const YAML::Node& n, Period& out) {
  std::string s, why;
  if (auto e = scalar_or_err(n, s, "a period like 10ep or 500u"); !e.empty()) return e;
  auto p = Period::try_parse(s, &why);
  if (!p) return why;
  out = *p;
  return "";
}

std::string decode(const YAML::Node& n, Count& out) {
  std::string s;
  if (auto e = scalar_or_err(n, s, "an integer or auto"); !e.empty()) return e;
  if (s == "auto") return out = Count::automatic(), "";
  int64_t v = 0;
  if (decode(n, v) != "" || v < 0)
    return "expected a non-negative integer or auto, got '" + s + "'";
  out = Count::of(v);
  return "";
}

std::string decode(const YAML::Node& n, AutoSize& out) {
  Count c;
  if (auto e = decode(n, c); !e.empty()) return e;
  out = c.is_auto() ? AutoSize::automatic() : AutoSize(c.value);
  return "";
}

std::string decode(const YAML::Node& n, Duration& out) {
  std::string s, why;
  if (auto e = scalar_or_err(n, s, "a duration like 90s, 30m or 2h"); !e.empty()) return e;
  auto d = Duration::try_parse(s, &why);
  if (!d) return why;
  out = *d;
  return "";
}

std::string decode(const YAML::Node& n, Scalar& out) {
  std::string s;
  if (auto e = scalar_or_err(n, s, "a single value (number, true/false or string)"); !e.empty())
    return e;
  out = {s, n.Tag() == "!"};  // yaml-cpp tags quoted scalars "!"
  return "";
}

template <class T>
static std::string decode_list(const YAML::Node& n, std::vector<T>& out) {
  if (!n.IsSequence()) return "expected a list like [1, 2]";
  std::vector<T> v;
  for (size_t i = 0; i < n.size(); ++i) {
    T x{};
    auto e = decode(n[i], x);
    if (!e.empty()) return "entry " + std::to_string(i) + ": " + e;
    v.push_back(x);
  }
  out = v;
  return "";
}
std::string decode(const YAML::Node& n, std::vector<int64_t>& out) { return decode_list(n, out); }
std::string decode(const YAML::Node& n, std::vector<double>& out) { return decode_list(n, out); }
std::string decode(const YAML::Node& n, std::vector<Period>& out) { return decode_list(n, out); }
std::string decode(const YAML::Node& n, std::vector<std::string>& out) {
  return decode_list(n, out);
}
std::string decode(const YAML::Node& n, std::vector<Scalar>& out) { return decode_list(n, out); }

void Reader::finish() {
  if (!node_.IsMap()) return;
  std::map<std::string, YAML::Mark> seen;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.Scalar();
    const YAML::Mark mark = it->first.Mark();
    auto prev = seen.find(key);
    if (prev != seen.end()) {
      issues_.add(mark_text(file_, mark), prefix_ + key,
                  "duplicate key (first set at line " + std::to_string(prev->second.line + 1) +
                      "); YAML would silently keep one of them");
      continue;
    }
    seen[key] = mark;
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
      std::string hint = did_you_mean(key, keys_);
      std::string msg = "unknown key";
      if (!hint.empty())
        msg += " (did you mean '" + hint + "'?)";
      else {
        msg += "; valid keys here:";
        for (auto& k : keys_) msg += " " + k;
      }
      issues_.add(mark_text(file_, mark), prefix_ + key, msg);
    }
  }
}

std::string SchemaWriter::text() const {
  size_t w0 = 0, w1 = 0, w2 = 0;
  for (auto& r : rows_) {
    w0 = std::max(w0, r.path.size());
    w1 = std::max(w1, r.type.size());
    w2 = std::max(w2, std::min<size_t>(r.default_value.size(), 24));
  }
  std::ostringstream o;
  auto pad = [](const std::string& s, size_t w) {
    return s + std::string(w > s.size() ? w - s.size() : 0, ' ');
  };
  o << pad("key", w0) << "  " << pad("type", w1) << "  " << pad("default", w2) << "  description\n";
  for (auto& r : rows_) {
    o << pad(r.path, w0) << "  " << pad(r.type, w1) << "  " << pad(r.default_value, w2) << "  "
      << r.doc;
    if (!r.check.empty()) o << " (" << r.check << ")";
    o << "\n";
  }
  return o.str();
}

}  // namespace mltrain::config
