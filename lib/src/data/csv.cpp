// CSV tables: numeric and categorical feature columns, class / float / multi-hot targets.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <deque>
#include <set>
#include <string_view>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/data/sources.hpp"

namespace mltrain::data {

namespace {

// The file's text and where each row starts: cells are split again when a pass reads the row, so a
// table costs its text plus one offset per row, not one string per cell (a 130 MB table of 47 M
// cells held as strings took 2 GB).
struct Table {
  std::string text;
  std::vector<std::string> header;
  std::vector<size_t> starts;  // offset of each data row in text
  std::vector<int64_t> lines;  // 1-based line of each row, for errors
  char delim = ',';
};

// One row's cells: views into the table's text, or into `unquoted` for quoted cells holding "".
struct Row {
  std::vector<std::string_view> cells;
  std::deque<std::string> unquoted;  // a deque: growing it keeps earlier views valid
  std::string_view operator[](int64_t c) const { return cells[static_cast<size_t>(c)]; }
};

// RFC 4180: quoted cells may hold delimiters, quotes ("") and newlines. Splits the row starting at
// `pos`; returns the offset after its line end. `line` counts newlines, quoted ones included.
size_t split(const std::string& text, size_t pos, char delim, Row& row, int64_t* line = nullptr) {
  row.cells.clear();
  row.unquoted.clear();
  const size_t n = text.size();
  while (true) {
    size_t i = pos;
    if (i < n && text[i] == '"') {  // quoted cell
      std::string cell;
      bool escaped = false;
      size_t j = i + 1;
      for (; j < n; ++j) {
        if (text[j] == '"' && j + 1 < n && text[j + 1] == '"') {
          cell += '"', ++j, escaped = true;
        } else if (text[j] == '"') {
          break;
        } else {
          if (text[j] == '\n' && line) ++*line;
          cell += text[j];
        }
      }
      if (j >= n) return std::string::npos;  // unterminated
      // Text after the closing quote, up to the delimiter, belongs to the cell as written.
      size_t k = j + 1;
      while (k < n && text[k] != delim && text[k] != '\n') ++k;
      size_t stop = k;
      if (stop > j + 1 && text[stop - 1] == '\r') --stop;
      if (escaped || stop > j + 1) {
        cell.append(text, j + 1, stop - j - 1);
        row.unquoted.push_back(std::move(cell));
        row.cells.emplace_back(row.unquoted.back());
      } else {
        row.cells.emplace_back(text.data() + i + 1, j - i - 1);
      }
      i = k;
    } else {
      size_t k = i;
      while (k < n && text[k] != delim && text[k] != '\n') ++k;
      size_t stop = k;
      if (stop > i && text[stop - 1] == '\r') --stop;
      row.cells.emplace_back(text.data() + i, stop - i);
      i = k;
    }
    if (i < n && text[i] == delim) {
      pos = i + 1;
      continue;
    }
    if (i < n && line) ++*line;  // the row's own newline
    return i < n ? i + 1 : n;
  }
}

Table parse(const std::string& path, std::string text, char delim, bool header) {
  Table t;
  t.text = std::move(text);
  t.delim = delim;
  Row row;
  int64_t line = 1;
  size_t ncol = 0;
  bool first = true;
  for (size_t pos = 0; pos < t.text.size();) {
    const int64_t row_line = line;
    const size_t next = split(t.text, pos, delim, row, &line);
    if (next == std::string::npos)
      throw DataError(path + ":" + std::to_string(row_line), "unterminated quoted cell",
                      "close the quote (a quote inside a quoted cell is written \"\")");
    const bool blank = row.cells.size() == 1 && row.cells[0].empty();
    if (!blank) {
      if (first && header) {
        for (const auto& c : row.cells) t.header.emplace_back(c);
        ncol = row.cells.size();
      } else {
        if (first) ncol = row.cells.size();
        if (row.cells.size() != ncol)
          throw DataError(
              path + ":" + std::to_string(row_line),
              "row has " + std::to_string(row.cells.size()) + " cells, the " +
                  (header ? "header " : "first row ") + std::to_string(ncol),
              "every row needs one cell per column (quote cells holding the delimiter)");
        t.starts.push_back(pos);
        t.lines.push_back(row_line);
      }
      first = false;
    }
    pos = next;
  }
  if (t.starts.empty()) throw DataError(path, "no rows", "the table is empty");
  if (!header)
    for (size_t c = 0; c < ncol; ++c) t.header.push_back(std::to_string(c));
  return t;
}

// Cells of row r (re-split from the text).
void cells(const Table& t, size_t r, Row& row) { split(t.text, t.starts[r], t.delim, row); }

int64_t column(const Table& t, const std::string& path, const std::string& key,
               const std::string& what) {
  for (size_t c = 0; c < t.header.size(); ++c)
    if (t.header[c] == key) return static_cast<int64_t>(c);
  int64_t idx = -1;
  const auto r = std::from_chars(key.data(), key.data() + key.size(), idx);
  if (r.ec == std::errc() && r.ptr == key.data() + key.size() && idx >= 0 &&
      idx < static_cast<int64_t>(t.header.size()))
    return idx;
  std::string names;
  for (const auto& h : t.header) names += (names.empty() ? "" : ", ") + h;
  throw DataError(path, what + " column '" + key + "' not found",
                  "columns are: " + names + " (or give a 0-based index)");
}

bool missing(std::string_view s) {
  return s.empty() || s == "NA" || s == "N/A" || s == "NaN" || s == "nan" || s == "null";
}

bool number(std::string_view s, double* v) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  if (a == std::string_view::npos) return false;
  const char* p = s.data() + a;
  const char* e = s.data() + b + 1;
  if (*p == '+') ++p;
  const auto r = std::from_chars(p, e, *v);
  return r.ec == std::errc() && r.ptr == e && std::isfinite(*v);
}

std::string where(const std::string& path, const Table& t, size_t r, int64_t c) {
  return path + ":" + std::to_string(t.lines[r]) + ", column '" + t.header[c] + "'";
}

// The columns load_csv reads, resolved against the header.
struct Columns {
  std::string path;
  const Table& t;
  std::vector<int64_t> features, targets;
  std::vector<char> categorical;  // per table column
  bool cat(int64_t c) const { return categorical[static_cast<size_t>(c)] != 0; }
};

Columns columns_of(const std::string& path, const Table& t, const CsvOptions& opt) {
  Columns cs{path, t, {}, {}, std::vector<char>(t.header.size(), 0)};
  const int64_t ncol = static_cast<int64_t>(t.header.size());
  if (opt.inputs_only) {  // the training table's feature columns, wherever they are here
    for (const auto& k : opt.reuse->feature_columns)
      cs.features.push_back(column(t, path, k, "the training table's feature"));
    for (const auto& k : opt.categorical)
      cs.categorical[static_cast<size_t>(column(t, path, k, "categorical"))] = 1;
    return cs;
  }
  if (opt.targets.empty()) cs.targets.push_back(ncol - 1);
  for (const auto& k : opt.targets) cs.targets.push_back(column(t, path, k, "target"));
  for (const auto& k : opt.features) cs.features.push_back(column(t, path, k, "feature"));
  if (opt.features.empty())
    for (int64_t c = 0; c < ncol; ++c)
      if (std::find(cs.targets.begin(), cs.targets.end(), c) == cs.targets.end())
        cs.features.push_back(c);
  if (cs.features.empty()) throw DataError(path, "no feature columns", "set data.csv.features");
  for (const auto& k : opt.categorical)
    cs.categorical[static_cast<size_t>(column(t, path, k, "categorical"))] = 1;
  return cs;
}

// Categories (sorted distinct values) and numeric means of the training table's feature columns.
void learn_columns(const Columns& cs, CsvOptions::Learned& L) {
  const Table& t = cs.t;
  const std::vector<int64_t>& fcols = cs.features;
  const size_t F = fcols.size(), N = t.starts.size();
  std::vector<std::set<std::string, std::less<>>> seen(F);
  std::vector<double> sum(F, 0.0);
  std::vector<int64_t> n(F, 0);
  Row row;
  for (size_t r = 0; r < N; ++r) {
    cells(t, r, row);
    for (size_t f = 0; f < F; ++f) {
      const std::string_view s = row[fcols[f]];
      double v = 0;
      if (missing(s)) continue;
      if (cs.cat(fcols[f])) {
        if (seen[f].find(s) == seen[f].end()) seen[f].emplace(s);
      } else if (number(s, &v)) {
        sum[f] += v, ++n[f];
      }
    }
  }
  L.categories.assign(F, {});
  L.means.assign(F, 0.0);
  L.stds.assign(F, 1.0);
  for (size_t f = 0; f < F; ++f) {
    L.categories[f].assign(seen[f].begin(), seen[f].end());  // sorted, distinct
    L.means[f] = n[f] > 0 ? sum[f] / static_cast<double>(n[f]) : 0.0;
  }
}

// One feature cell as a float: a number, a category id, or the fill of a missing cell.
double feature_value(const Columns& cs, const CsvOptions& opt, const CsvOptions::Learned& L,
                     std::string_view s, size_t r, size_t f) {
  const int64_t c = cs.features[f];
  double v = 0;
  if (missing(s)) {
    if (opt.fill == "error")
      throw DataError(where(cs.path, cs.t, r, c), "missing value",
                      "fill the cell, or set data.csv.fill to mean, zero or a number");
    return opt.fill == "mean" ? L.means[f] : opt.fill == "zero" ? 0.0 : std::stod(opt.fill);
  }
  if (cs.cat(c)) {
    const auto& k = L.categories[f];
    const auto it = std::lower_bound(k.begin(), k.end(), s);
    if (it == k.end() || *it != s)
      throw DataError(where(cs.path, cs.t, r, c),
                      "category '" + std::string(s) + "' is not in the training table",
                      "add it to the training data, or map it to a known value");
    return static_cast<double>(it - k.begin());
  }
  if (!number(s, &v))
    throw DataError(where(cs.path, cs.t, r, c), "'" + std::string(s) + "' is not a number",
                    "fix the cell, or list the column in data.csv.categorical");
  return v;
}

// Features as floats, row by row.
std::shared_ptr<std::vector<float>> read_features(const Columns& cs, const CsvOptions& opt,
                                                  const CsvOptions::Learned& L) {
  const size_t F = cs.features.size(), N = cs.t.starts.size();
  auto values = std::make_shared<std::vector<float>>(N * F);
  Row row;
  for (size_t r = 0; r < N; ++r) {
    cells(cs.t, r, row);
    for (size_t f = 0; f < F; ++f)
      (*values)[r * F + f] =
          static_cast<float>(feature_value(cs, opt, L, row[cs.features[f]], r, f));
  }
  return values;
}

// Mean and standard deviation of each filled feature column (what the model sees).
void learn_scale(const std::vector<float>& values, size_t N, size_t F, CsvOptions::Learned& L) {
  std::vector<double> m(F, 0.0), q(F, 0.0);
  for (size_t r = 0; r < N; ++r)
    for (size_t f = 0; f < F; ++f) m[f] += values[r * F + f];
  for (size_t f = 0; f < F; ++f) m[f] /= static_cast<double>(std::max<size_t>(N, 1));
  for (size_t r = 0; r < N; ++r)
    for (size_t f = 0; f < F; ++f) q[f] += std::pow(values[r * F + f] - m[f], 2);
  for (size_t f = 0; f < F; ++f) {
    const double sd = std::sqrt(q[f] / static_cast<double>(std::max<size_t>(N, 1)));
    L.stds[f] = sd > 0 ? sd : 1.0;
    L.scale_means.push_back(m[f]);
  }
}

// The target column as class ids: integers as written, or text names mapped to sorted ids.
std::shared_ptr<std::vector<int64_t>> class_labels(const Columns& cs, const CsvOptions& opt,
                                                   CsvOptions::Learned& L) {
  const Table& t = cs.t;
  const std::string& path = cs.path;
  const size_t N = t.starts.size();
  if (cs.targets.size() != 1)
    throw DataError(path, "classification takes one target column", "set one data.csv.target");
  const int64_t c = cs.targets[0];
  Row row;
  bool text = !opt.reuse ? false : !L.class_names.empty();
  if (!opt.reuse) {
    std::set<std::string, std::less<>> names;
    for (size_t r = 0; r < N; ++r) {
      cells(t, r, row);
      double v = 0;
      text = text || !number(row[c], &v);
      if (names.find(row[c]) == names.end()) names.emplace(row[c]);
    }
    if (text) L.class_names.assign(names.begin(), names.end());
  }
  auto labels = std::make_shared<std::vector<int64_t>>(N);
  for (size_t r = 0; r < N; ++r) {
    cells(t, r, row);
    const std::string_view s = row[c];
    double v = -1;
    if (text) {
      const auto it = std::lower_bound(L.class_names.begin(), L.class_names.end(), s);
      if (it == L.class_names.end() || *it != s)
        throw DataError(where(path, t, r, c),
                        "class '" + std::string(s) + "' is not in the training table",
                        "every test class must occur in training");
      v = static_cast<double>(it - L.class_names.begin());
    } else if (!number(s, &v) || v != std::floor(v)) {
      throw DataError(where(path, t, r, c),
                      "class label '" + std::string(s) + "' is not an integer id",
                      "use ids 0..K-1 or text class names in every row");
    }
    if (v < 0 || v >= static_cast<double>(opt.num_classes))
      throw DataError(where(path, t, r, c),
                      "class " + std::to_string(static_cast<int64_t>(v)) + " not in [0, " +
                          std::to_string(opt.num_classes) + ")",
                      "set data.num_classes=" +
                          std::to_string(text ? L.class_names.size() : static_cast<size_t>(v) + 1));
    (*labels)[r] = static_cast<int64_t>(v);
  }
  return labels;
}

std::shared_ptr<std::vector<float>> float_targets(const Columns& cs, const CsvOptions& opt) {
  const Table& t = cs.t;
  const std::string& path = cs.path;
  const std::vector<int64_t>& tcols = cs.targets;
  const size_t N = t.starts.size();
  const size_t T = tcols.size();
  auto targets = std::make_shared<std::vector<float>>(N * T);
  Row row;
  for (size_t r = 0; r < N; ++r) {
    cells(t, r, row);
    for (size_t k = 0; k < T; ++k) {
      const int64_t c = tcols[k];
      double v = 0;
      if (!number(row[c], &v))
        throw DataError(where(path, t, r, c),
                        "target '" + std::string(row[c]) + "' is not a number",
                        "targets must be numbers (missing targets are never filled)");
      if (opt.target_kind == TargetKind::kMultiHot && v != 0 && v != 1)
        throw DataError(where(path, t, r, c), "multilabel target must be 0 or 1", "fix the cell");
      (*targets)[r * T + k] = static_cast<float>(v);
    }
  }
  if (opt.target_kind == TargetKind::kMultiHot && static_cast<int64_t>(T) != opt.num_classes)
    throw DataError(
        path,
        std::to_string(T) + " target columns for " + std::to_string(opt.num_classes) + " classes",
        "list one 0/1 column per class in data.csv.target");
  return targets;
}

}  // namespace

Dataset load_csv(const std::string& path, const CsvOptions& opt, CsvOptions::Learned* learned) {
  Table t = parse(path, read_file(path), opt.delimiter, opt.header);
  const Columns cs = columns_of(path, t, opt);
  CsvOptions::Learned L = opt.reuse ? *opt.reuse : CsvOptions::Learned{};
  const size_t F = cs.features.size(), N = t.starts.size();
  if (opt.inputs_only && !opt.reuse)
    throw std::logic_error("load_csv: inputs_only needs the training table's columns (reuse)");
  if (!opt.reuse) {  // from this, the training, table
    learn_columns(cs, L);
    for (const int64_t c : cs.features)
      L.feature_columns.push_back(t.header[static_cast<size_t>(c)]);  // "3" without a header
  }
  if (L.categories.size() != F)
    throw DataError(path,
                    "has " + std::to_string(F) + " feature columns, the training table " +
                        std::to_string(L.categories.size()),
                    "give both tables the same columns");
  const auto values = read_features(cs, opt, L);
  if (!opt.reuse) learn_scale(*values, N, F, L);
  if (opt.standardize)
    for (size_t r = 0; r < N; ++r)
      for (size_t f = 0; f < F; ++f)
        (*values)[r * F + f] =
            static_cast<float>(((*values)[r * F + f] - L.scale_means[f]) / L.stds[f]);
  Dataset d;
  d.source = path;
  d.dtype = DType::kF32;
  d.count = static_cast<int64_t>(N);
  d.sample_shape = {static_cast<int64_t>(F)};
  d.data = reinterpret_cast<const uint8_t*>(values->data());
  d.storage = values;
  d.num_classes = opt.num_classes;
  if (opt.inputs_only) {  // nothing to learn from: the model's outputs are what is wanted
    d.labels = std::make_shared<std::vector<int64_t>>(N, 0);
  } else if (opt.target_kind == TargetKind::kClassId) {
    d.labels = class_labels(cs, opt, L);
  } else {
    const int64_t T = static_cast<int64_t>(cs.targets.size());
    d.targets = float_targets(cs, opt);
    if (T > 1 || opt.target_kind == TargetKind::kMultiHot) d.target_shape = {T};
    d.labels = std::make_shared<std::vector<int64_t>>();
  }
  if (learned) *learned = L;
  return d;
}

}  // namespace mltrain::data
