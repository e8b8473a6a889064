// CSV tables: numeric and categorical feature columns, class / float / multi-hot targets.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/data/sources.hpp"

namespace mltrain::data {

namespace {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<int64_t> lines;  // 1-based line of each row, for errors
};

// RFC 4180: quoted cells may hold delimiters, quotes ("") and newlines.
Table parse(const std::string& path, const std::string& text, char delim, bool header) {
  Table t;
  std::vector<std::string> row;
  std::string cell;
  bool quoted = false, any = false;
  int64_t line = 1, row_line = 1;
  auto end_row = [&] {
    row.push_back(std::move(cell));
    cell.clear();
    const bool blank = row.size() == 1 && row[0].empty();
    if (!blank) {
      t.rows.push_back(std::move(row));
      t.lines.push_back(row_line);
    }
    row.clear();
    any = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch == '"' && i + 1 < text.size() && text[i + 1] == '"')
        cell += '"', ++i;
      else if (ch == '"')
        quoted = false;
      else
        cell += ch, line += ch == '\n';
      continue;
    }
    if (!any) row_line = line;
    any = true;
    if (ch == '"' && cell.empty())
      quoted = true;
    else if (ch == delim)
      row.push_back(std::move(cell)), cell.clear();
    else if (ch == '\n')
      end_row(), ++line;
    else if (ch != '\r')
      cell += ch;
  }
  if (quoted)
    throw DataError(path + ":" + std::to_string(row_line), "unterminated quoted cell",
                    "close the quote (a quote inside a quoted cell is written \"\")");
  if (any || !cell.empty()) end_row();
  if (t.rows.empty()) throw DataError(path, "no rows", "the table is empty");
  if (header) {
    t.header = t.rows.front();
    t.rows.erase(t.rows.begin());
    t.lines.erase(t.lines.begin());
  } else {
    for (size_t c = 0; c < t.rows.front().size(); ++c) t.header.push_back(std::to_string(c));
  }
  for (size_t r = 0; r < t.rows.size(); ++r)
    if (t.rows[r].size() != t.header.size())
      throw DataError(path + ":" + std::to_string(t.lines[r]),
                      "row has " + std::to_string(t.rows[r].size()) + " cells, the header " +
                          std::to_string(t.header.size()),
                      "every row needs one cell per column (quote cells holding the delimiter)");
  return t;
}

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

bool missing(const std::string& s) {
  return s.empty() || s == "NA" || s == "N/A" || s == "NaN" || s == "nan" || s == "null";
}

bool number(const std::string& s, double* v) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  if (a == std::string::npos) return false;
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
  const size_t F = fcols.size(), N = t.rows.size();
  L.categories.assign(F, {});
  L.means.assign(F, 0.0);
  L.stds.assign(F, 1.0);
  for (size_t f = 0; f < F; ++f) {
    const int64_t c = fcols[f];
    double sum = 0;
    int64_t n = 0;
    for (size_t r = 0; r < N; ++r) {
      const std::string& s = t.rows[r][static_cast<size_t>(c)];
      double v = 0;
      if (missing(s)) continue;
      if (cs.cat(c))
        L.categories[f].push_back(s);
      else if (number(s, &v))
        sum += v, ++n;
    }
    auto& k = L.categories[f];
    std::sort(k.begin(), k.end());
    k.erase(std::unique(k.begin(), k.end()), k.end());
    L.means[f] = n > 0 ? sum / static_cast<double>(n) : 0.0;
  }
}

// Features as floats: numbers, category ids, filled missing cells.
std::shared_ptr<std::vector<float>> read_features(const Columns& cs, const CsvOptions& opt,
                                                  const CsvOptions::Learned& L) {
  const Table& t = cs.t;
  const std::string& path = cs.path;
  const std::vector<int64_t>& fcols = cs.features;
  const size_t F = fcols.size(), N = t.rows.size();
  auto values = std::make_shared<std::vector<float>>(N * F);
  for (size_t r = 0; r < N; ++r)
    for (size_t f = 0; f < F; ++f) {
      const int64_t c = fcols[f];
      const std::string& s = t.rows[r][static_cast<size_t>(c)];
      double v = 0;
      if (missing(s)) {
        if (opt.fill == "error")
          throw DataError(where(path, t, r, c), "missing value",
                          "fill the cell, or set data.csv.fill to mean, zero or a number");
        v = opt.fill == "mean" ? L.means[f] : opt.fill == "zero" ? 0.0 : std::stod(opt.fill);
      } else if (cs.cat(c)) {
        const auto& k = L.categories[f];
        const auto it = std::lower_bound(k.begin(), k.end(), s);
        if (it == k.end() || *it != s)
          throw DataError(where(path, t, r, c), "category '" + s + "' is not in the training table",
                          "add it to the training data, or map it to a known value");
        v = static_cast<double>(it - k.begin());
      } else if (!number(s, &v)) {
        throw DataError(where(path, t, r, c), "'" + s + "' is not a number",
                        "fix the cell, or list the column in data.csv.categorical");
      }
      (*values)[r * F + f] = static_cast<float>(v);
    }
  return values;
}

// Mean and standard deviation of each filled feature column (what the model sees).
void learn_scale(const std::vector<float>& values, size_t N, size_t F, CsvOptions::Learned& L) {
  const auto* v = &values;
  for (size_t f = 0; f < F; ++f) {
    double m = 0, q = 0;
    for (size_t r = 0; r < N; ++r) m += (*v)[r * F + f];
    m /= static_cast<double>(std::max<size_t>(N, 1));
    for (size_t r = 0; r < N; ++r) q += std::pow((*v)[r * F + f] - m, 2);
    const double sd = std::sqrt(q / static_cast<double>(std::max<size_t>(N, 1)));
    L.stds[f] = sd > 0 ? sd : 1.0;
    L.scale_means.push_back(m);
  }
}

std::shared_ptr<std::vector<int64_t>> class_labels(const Columns& cs, const CsvOptions& opt,
                                                   CsvOptions::Learned& L) {
  const Table& t = cs.t;
  const std::string& path = cs.path;
  const size_t N = t.rows.size();
  if (cs.targets.size() != 1)
    throw DataError(path, "classification takes one target column", "set one data.csv.target");
  const int64_t c = cs.targets[0];
  bool text = !opt.reuse ? false : !L.class_names.empty();
  if (!opt.reuse)
    for (size_t r = 0; r < N && !text; ++r) {
      double v = 0;
      text = !number(t.rows[r][static_cast<size_t>(c)], &v);
    }
  if (text && !opt.reuse) {
    for (size_t r = 0; r < N; ++r) L.class_names.push_back(t.rows[r][static_cast<size_t>(c)]);
    std::sort(L.class_names.begin(), L.class_names.end());
    L.class_names.erase(std::unique(L.class_names.begin(), L.class_names.end()),
                        L.class_names.end());
  }
  auto labels = std::make_shared<std::vector<int64_t>>(N);
  for (size_t r = 0; r < N; ++r) {
    const std::string& s = t.rows[r][static_cast<size_t>(c)];
    double v = -1;
    if (text) {
      const auto it = std::lower_bound(L.class_names.begin(), L.class_names.end(), s);
      if (it == L.class_names.end() || *it != s)
        throw DataError(where(path, t, r, c), "class '" + s + "' is not in the training table",
                        "every test class must occur in training");
      v = static_cast<double>(it - L.class_names.begin());
    } else if (!number(s, &v) || v != std::floor(v)) {
      throw DataError(where(path, t, r, c), "class label '" + s + "' is not an integer id",
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
  const size_t N = t.rows.size();
  const size_t T = tcols.size();
  auto targets = std::make_shared<std::vector<float>>(N * T);
  for (size_t r = 0; r < N; ++r)
    for (size_t k = 0; k < T; ++k) {
      const int64_t c = tcols[k];
      double v = 0;
      if (!number(t.rows[r][static_cast<size_t>(c)], &v))
        throw DataError(where(path, t, r, c),
                        "target '" + t.rows[r][static_cast<size_t>(c)] + "' is not a number",
                        "targets must be numbers (missing targets are never filled)");
      if (opt.target_kind == TargetKind::kMultiHot && v != 0 && v != 1)
        throw DataError(where(path, t, r, c), "multilabel target must be 0 or 1", "fix the cell");
      (*targets)[r * T + k] = static_cast<float>(v);
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
  const Table t = parse(path, read_file(path), opt.delimiter, opt.header);
  const Columns cs = columns_of(path, t, opt);
  CsvOptions::Learned L = opt.reuse ? *opt.reuse : CsvOptions::Learned{};
  const size_t F = cs.features.size(), N = t.rows.size();
  if (!opt.reuse) learn_columns(cs, L);  // from this, the training, table
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
  if (opt.target_kind == TargetKind::kClassId) {
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
