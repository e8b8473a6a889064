#include "mltrain/tune/analysis.hpp"

#include "mltrain/tune/pareto.hpp"

#include <algorithm>
#include <iomanip>
#include <cmath>
#include <numeric>
#include <sstream>

#include "mltrain/config/experiment.hpp"
#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/svg.hpp"

namespace fs = std::filesystem;

namespace mltrain::tune {
namespace {

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

std::string cell(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
}

// Position of a parameter value in [0, 1] for plots and importance (categoricals: evenly spaced).
double unit_of(const Param& p, double x) {
  if (p.numeric()) return p.to_unit(x);
  return p.n_choices() > 1 ? x / double(p.n_choices() - 1) : 0.5;
}

std::vector<double> ranks(const std::vector<double>& v) {  // average ranks for ties
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j);
    i = j + 1;
  }
  return r;
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = double(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n,
               mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i)
    sab += (a[i] - ma) * (b[i] - mb), saa += (a[i] - ma) * (a[i] - ma),
        sbb += (b[i] - mb) * (b[i] - mb);
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

// Density of points on a 64-cell grid over [0, 1]: Gaussian KDE (Scott bandwidth) for numeric
// parameters, smoothed frequencies for categoricals.
std::vector<double> density(const Param& p, const std::vector<double>& u) {
  const int G = p.numeric() ? 64 : int(p.n_choices());
  std::vector<double> d(size_t(G), 1e-9);
  if (p.numeric()) {
    double m = std::accumulate(u.begin(), u.end(), 0.0) / double(u.size()), v = 0;
    for (double x : u) v += (x - m) * (x - m);
    const double sd = std::sqrt(v / std::max<double>(1, double(u.size()) - 1));
    const double bw = std::max(0.02, std::max(sd, 0.05) * std::pow(double(u.size()), -0.2));
    for (int g = 0; g < G; ++g) {
      const double x = (g + 0.5) / G;
      for (double c : u) d[size_t(g)] += std::exp(-0.5 * (x - c) * (x - c) / (bw * bw));
    }
  } else {
    for (double c : u) d[size_t(std::lround(c * (G - 1)))] += 1.0;
    for (auto& x : d) x += 0.5;  // add-half smoothing
  }
  const double s = std::accumulate(d.begin(), d.end(), 0.0);
  for (auto& x : d) x /= s;
  return d;
}

}  // namespace

nlohmann::json parameter_importance(const Space& space, const std::vector<TrialState>& trials,
                                    bool maximize) {
  std::vector<const TrialState*> done;
  for (const auto& t : trials)
    if (t.state == "COMPLETE" && std::isfinite(t.value) && t.x.size() == space.size())
      done.push_back(&t);
  nlohmann::json out = nlohmann::json::array();
  if (done.size() < 4) return out;
  std::sort(done.begin(), done.end(),
            [&](auto a, auto b) { return maximize ? a->value > b->value : a->value < b->value; });
  const size_t top = std::max<size_t>(2, size_t(std::ceil(0.2 * double(done.size()))));
  std::vector<double> values;
  for (const auto* t : done) values.push_back(t->value);
  const auto rv = ranks(values);
  std::vector<double> raw;
  for (size_t d = 0; d < space.size(); ++d) {
    std::vector<double> all, best;
    for (size_t i = 0; i < done.size(); ++i) {
      const double u = unit_of(space[d], done[i]->x[d]);
      all.push_back(u);
      if (i < top) best.push_back(u);
    }
    // Pearson divergence between the top trials' density and all trials' density (PED-ANOVA,
    // Watanabe et al. 2023): 0 when the good trials are spread like every trial.
    const auto pa = density(space[d], all), pb = density(space[d], best);
    double div = 0;
    for (size_t g = 0; g < pa.size(); ++g) div += pa[g] * (pb[g] / pa[g] - 1) * (pb[g] / pa[g] - 1);
    raw.push_back(div);
    const double rho = space[d].numeric() ? pearson(ranks(all), rv) : NAN;
    out.push_back(
        {{"param", space[d].name},
         {"spearman", std::isfinite(rho) ? nlohmann::json(rho) : nlohmann::json(nullptr)}});
  }
  const double s = std::accumulate(raw.begin(), raw.end(), 0.0);
  for (size_t d = 0; d < space.size(); ++d)
    out[d]["importance"] = s > 0 ? raw[d] / s : 1.0 / double(space.size());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a["importance"].template get<double>() > b["importance"].template get<double>();
  });
  return out;
}

std::string svg_bars(const std::string& title, const std::vector<std::string>& labels,
                     const std::vector<double>& values) {
  const int W = 720, row = 26, T = 40, L = 220, R = 60;
  const int H = T + row * int(labels.size()) + 20;
  double mx = 0;
  for (double v : values) mx = std::max(mx, v);
  if (mx <= 0) mx = 1;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">"
    << xml_escape(title) << "</text>\n";
  for (size_t i = 0; i < labels.size(); ++i) {
    const double y = T + row * double(i);
    const double w = (W - L - R) * values[i] / mx;
    o << "<text x=\"" << L - 8 << "\" y=\"" << y + 16 << "\" text-anchor=\"end\">"
      << xml_escape(labels[i]) << "</text>\n";
    o << "<rect x=\"" << L << "\" y=\"" << y + 4 << "\" width=\"" << w << "\" height=\"" << row - 8
      << "\" fill=\"#1f77b4\"/>\n";
    o << "<text x=\"" << L + w + 6 << "\" y=\"" << y + 16 << "\">"
      << config::format_fixed(values[i], 3) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string svg_parallel(const std::string& title, const Space& space,
                         const std::vector<TrialState>& trials, bool maximize,
                         const std::string& metric) {
  std::vector<const TrialState*> done;
  for (const auto& t : trials)
    if (t.state == "COMPLETE" && std::isfinite(t.value) && t.x.size() == space.size())
      done.push_back(&t);
  const int W = 760, H = 420, L = 60, R = 60, T = 50, B = 60;
  const size_t axes = space.size() + 1;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* t : done) lo = std::min(lo, t->value), hi = std::max(hi, t->value);
  if (!(hi > lo)) hi = lo + 1;
  auto ax = [&](size_t k) {
    return L + (W - L - R) * (axes > 1 ? double(k) / double(axes - 1) : 0.5);
  };
  auto ay = [&](double u) { return T + (H - T - B) * (1 - u); };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">"
    << xml_escape(title) << "</text>\n";
  // Worse trials first, so the best are drawn on top; colour from grey (worst) to red (best).
  std::sort(done.begin(), done.end(),
            [&](auto a, auto b) { return maximize ? a->value < b->value : a->value > b->value; });
  for (const auto* t : done) {
    const double q = maximize ? (t->value - lo) / (hi - lo) : (hi - t->value) / (hi - lo);
    const int r = int(150 + 100 * q), g = int(150 - 120 * q), b = int(150 - 120 * q);
    o << "<polyline fill=\"none\" stroke=\"rgb(" << r << "," << g << "," << b
      << ")\" stroke-width=\"" << (q > 0.9 ? 2.0 : 1.0) << "\" points=\"";
    for (size_t d = 0; d < space.size(); ++d)
      o << ax(d) << "," << ay(unit_of(space[d], t->x[d])) << " ";
    o << ax(space.size()) << "," << ay((t->value - lo) / (hi - lo)) << "\"/>\n";
  }
  for (size_t k = 0; k < axes; ++k) {
    const std::string name = k < space.size() ? space[k].name : metric;
    o << "<line x1=\"" << ax(k) << "\" x2=\"" << ax(k) << "\" y1=\"" << T << "\" y2=\"" << H - B
      << "\" stroke=\"#444\"/>\n";
    o << "<text x=\"" << ax(k) << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\">"
      << xml_escape(name) << "</text>\n";
    std::string top, bottom;
    if (k == space.size())
      top = config::format_fixed(hi, 4), bottom = config::format_fixed(lo, 4);
    else if (space[k].numeric())
      top = cell(space[k].to_json(space[k].high)), bottom = cell(space[k].to_json(space[k].low));
    else
      top = cell(space[k].choices.back()), bottom = cell(space[k].choices.front());
    o << "<text x=\"" << ax(k) << "\" y=\"" << T - 6 << "\" text-anchor=\"middle\">"
      << xml_escape(top) << "</text>\n";
    o << "<text x=\"" << ax(k) << "\" y=\"" << H - B + 32
      << "\" text-anchor=\"middle\" fill=\"#666\">" << xml_escape(bottom) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

namespace {

// Complete trials with every objective, in minimisation sense.
struct FrontInput {
  std::vector<const TrialState*> trials;
  std::vector<Point> points;
};
FrontInput front_input(const StudyConfig& cfg, const std::vector<TrialState>& trials) {
  FrontInput f;
  for (const auto& t : trials) {
    if (t.state != "COMPLETE" || t.values.size() != cfg.objectives.size()) continue;
    Point p;
    for (size_t i = 0; i < t.values.size(); ++i)
      p.push_back(cfg.objectives[i].maximize ? -t.values[i] : t.values[i]);
    bool finite = true;
    for (double v : p) finite = finite && std::isfinite(v);
    if (finite) f.trials.push_back(&t), f.points.push_back(p);
  }
  return f;
}

// The first two objectives: every complete trial a grey dot, the front in colour joined by its
// staircase.
std::string svg_pareto(const std::string& title, const StudyConfig& cfg, const FrontInput& in,
                       const std::vector<int>& rank) {
  const double W = 720, H = 440, L = 70, R = 20, T = 40, B = 50;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto* t : in.trials) {
    x0 = std::min(x0, t->values[0]), x1 = std::max(x1, t->values[0]);
    y0 = std::min(y0, t->values[1]), y1 = std::max(y1, t->values[1]);
  }
  if (!(x1 > x0)) x0 -= 0.5, x1 += 0.5;
  if (!(y1 > y0)) y0 -= 0.5, y1 += 0.5;
  auto px = [&](double v) { return L + (v - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double v) { return H - B - (v - y0) / (y1 - y0) * (H - T - B); };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n<text x=\""
    << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << xml_escape(title)
    << "</text>\n";
  o << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
    << "\" stroke=\"#444\"/>\n<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\""
    << H - B << "\" stroke=\"#444\"/>\n";
  auto label = [&](const StudyConfig::Objective& ob) {
    return xml_escape(ob.metric + (ob.maximize ? " (max)" : " (min)"));
  };
  o << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 12 << "\" text-anchor=\"middle\">"
    << label(cfg.objectives[0]) << "</text>\n<text x=\"16\" y=\"" << (T + H - B) / 2
    << "\" transform=\"rotate(-90 16 " << (T + H - B) / 2 << ")\" text-anchor=\"middle\">"
    << label(cfg.objectives[1]) << "</text>\n";
  auto tick = [](double v) {  // three significant digits
    std::ostringstream t;
    t << std::setprecision(3) << v;
    return t.str();
  };
  for (double f : {0.0, 0.5, 1.0}) {
    o << "<text x=\"" << px(x0 + f * (x1 - x0)) << "\" y=\"" << H - B + 16
      << "\" text-anchor=\"middle\" fill=\"#666\">" << tick(x0 + f * (x1 - x0))
      << "</text>\n<text x=\"" << L - 6 << "\" y=\"" << py(y0 + f * (y1 - y0)) + 4
      << "\" text-anchor=\"end\" fill=\"#666\">" << tick(y0 + f * (y1 - y0)) << "</text>\n";
  }
  std::vector<const TrialState*> front;
  for (size_t i = 0; i < in.trials.size(); ++i) {
    if (rank[i] == 0) front.push_back(in.trials[i]);
    o << "<circle cx=\"" << px(in.trials[i]->values[0]) << "\" cy=\"" << py(in.trials[i]->values[1])
      << "\" r=\"3\" fill=\"" << (rank[i] == 0 ? "#d62728" : "#bbb") << "\"><title>trial "
      << in.trials[i]->number << "</title></circle>\n";
  }
  // The staircase along the front, in the first objective's order.
  std::sort(front.begin(), front.end(), [&](auto a, auto b) {
    return cfg.objectives[0].maximize ? a->values[0] > b->values[0] : a->values[0] < b->values[0];
  });
  o << "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\"";
  for (size_t i = 0; i < front.size(); ++i) {
    if (i > 0) o << px(front[i]->values[0]) << "," << py(front[i - 1]->values[1]) << " ";
    o << px(front[i]->values[0]) << "," << py(front[i]->values[1]) << " ";
  }
  o << "\"/>\n<text x=\"" << W - R << "\" y=\"" << T + 4
    << "\" text-anchor=\"end\" fill=\"#d62728\">Pareto front: " << front.size() << " of "
    << in.trials.size() << " complete trials</text>\n</svg>\n";
  return o.str();
}

// The Pareto front (pareto.json, pareto.svg) and its hypervolume, into the summary.
void write_front(const StudyConfig& cfg, const std::vector<TrialState>& trials, nlohmann::json& s) {
  const auto in = front_input(cfg, trials);
  nlohmann::json objectives = nlohmann::json::array();
  for (const auto& ob : cfg.objectives)
    objectives.push_back(
        {{"metric", ob.metric}, {"direction", ob.maximize ? "maximize" : "minimize"}});
  s["objectives"] = objectives;
  const auto rank = nondominated_ranks(in.points);
  nlohmann::json front = nlohmann::json::array();
  std::vector<Point> fp;
  for (size_t i = 0; i < in.trials.size(); ++i)
    if (rank[i] == 0) {
      front.push_back({{"number", in.trials[i]->number},
                       {"values", in.trials[i]->values},
                       {"params", in.trials[i]->params}});
      fp.push_back(in.points[i]);
    }
  // Hypervolume against the worst complete trial in each objective (the nadir of every trial,
  // so studies of one problem compare when they share it; pareto.json records it).
  Point ref(cfg.objectives.size(), -INFINITY);
  for (const auto& p : in.points)
    for (size_t i = 0; i < p.size(); ++i) ref[i] = std::max(ref[i], p[i]);
  nlohmann::json ref_reported = nlohmann::json::array();
  for (size_t i = 0; i < ref.size(); ++i)
    ref_reported.push_back(in.points.empty()
                               ? nlohmann::json(nullptr)
                               : nlohmann::json(cfg.objectives[i].maximize ? -ref[i] : ref[i]));
  const double hv = in.points.empty() ? 0.0 : hypervolume(fp, ref);
  s["pareto_front"] = front;
  s["hypervolume"] = hv;
  s["hypervolume_reference"] = ref_reported;
  const fs::path sd = cfg.study_dir();
  write_file_atomic((sd / "pareto.json").string(), nlohmann::json({{"objectives", objectives},
                                                                   {"front", front},
                                                                   {"hypervolume", hv},
                                                                   {"reference", ref_reported}})
                                                           .dump(2) +
                                                       "\n");
  if (cfg.objectives.size() >= 2 && !in.trials.empty())
    write_file_atomic((sd / "pareto.svg").string(),
                      svg_pareto("Pareto front: " + cfg.name(), cfg, in, rank));
}

}  // namespace

namespace {

struct Counts {
  int complete = 0, pruned = 0, failed = 0, running = 0;
  const TrialState* best = nullptr;  // on the first objective
};

// trials.csv and trials.jsonl, one row per trial; returns the counts and the best trial.
Counts write_trial_tables(const StudyConfig& cfg, const std::vector<TrialState>& trials) {
  const fs::path sd = cfg.study_dir();
  Counts n;
  std::ostringstream csv, jl;
  csv << "number,state,value";
  if (cfg.multi())
    for (const auto& ob : cfg.objectives) csv << "," << csv_escape(ob.metric);
  for (const auto& p : cfg.space) csv << "," << csv_escape(p.name);
  csv << ",reports,duration_s,retry_of,reason\n";
  for (const auto& t : trials) {
    if (t.number < 0) continue;
    n.complete += t.state == "COMPLETE", n.pruned += t.state == "PRUNED",
        n.failed += t.state == "FAIL", n.running += t.state == "RUNNING";
    if (t.state == "COMPLETE" && std::isfinite(t.value) &&
        (!n.best || (cfg.maximize ? t.value > n.best->value : t.value < n.best->value)))
      n.best = &t;
    const double dur = t.attrs.value("duration_s", t.finished > 0 ? t.finished - t.started : 0.0);
    csv << t.number << "," << t.state << ","
        << (std::isfinite(t.value) ? config::format_double(t.value) : "");
    if (cfg.multi())
      for (size_t i = 0; i < cfg.objectives.size(); ++i)
        csv << "," << (i < t.values.size() ? config::format_double(t.values[i]) : "");
    for (const auto& p : cfg.space)
      csv << "," << csv_escape(t.params.contains(p.name) ? cell(t.params[p.name]) : "");
    csv << "," << t.intermediate.size() << "," << config::format_fixed(dur, 2) << ","
        << (t.retry_of >= 0 ? std::to_string(t.retry_of) : "") << "," << csv_escape(t.reason)
        << "\n";
    nlohmann::json row = {{"number", t.number}, {"state", t.state},
                          {"params", t.params}, {"reports", t.intermediate.size()},
                          {"duration_s", dur},  {"reason", t.reason},
                          {"attrs", t.attrs}};
    row["value"] = std::isfinite(t.value) ? nlohmann::json(t.value) : nlohmann::json(nullptr);
    if (t.retry_of >= 0) row["retry_of"] = t.retry_of;
    if (!t.values.empty()) row["values"] = t.values;
    jl << row.dump() << "\n";
  }
  write_file_atomic((sd / "trials.csv").string(), csv.str());
  write_file_atomic((sd / "trials.jsonl").string(), jl.str());
  return n;
}

}  // namespace

nlohmann::json write_study_outputs(const StudyConfig& cfg, const std::vector<TrialState>& trials) {
  const fs::path sd = cfg.study_dir();
  const Counts counts = write_trial_tables(cfg, trials);
  const int complete = counts.complete, pruned = counts.pruned, failed = counts.failed,
            running = counts.running;
  const TrialState* best = counts.best;

  nlohmann::json s = {{"study", cfg.name()},
                      {"dir", sd.string()},
                      {"sampler", cfg.sampler.name},
                      {"pruner", cfg.pruner.name},
                      {"metric", cfg.metric},
                      {"direction", cfg.maximize ? "maximize" : "minimize"},
                      {"trials", complete + pruned + failed + running},
                      {"complete", complete},
                      {"pruned", pruned},
                      {"failed", failed},
                      {"running", running}};
  if (best) {
    s["best"] = {{"number", best->number},
                 {"value", best->value},
                 {"params", best->params},
                 {"attrs", best->attrs}};
    std::string yaml;
    // A cross-validated trial: its folds' values, as the fold group reported them.
    std::string folds_line;
    if (best->attrs.contains("folds") && best->attrs["folds"].is_object() &&
        best->attrs["folds"].contains(cfg.metric)) {
      folds_line = "# folds (" + std::to_string(cfg.folds()) + "): " + cfg.metric + " " +
                   best->attrs["folds"][cfg.metric].dump();
      if (best->attrs.contains(cfg.metric + "_std"))
        folds_line += ", mean " + best->attrs.value(cfg.metric + "_mean", nlohmann::json()).dump() +
                      ", sd " + best->attrs[cfg.metric + "_std"].dump();
      folds_line += "\n";
    }
    if (!cfg.train_config().empty()) {
      std::vector<std::string> ov = cfg.overrides();
      for (auto it = best->params.begin(); it != best->params.end(); ++it)
        ov.push_back(it.key() + "=" +
                     (it.value().is_string() ? it.value().get<std::string>() : it.value().dump()));
      ov.push_back("run.name=" + cfg.name() + "_best");
      yaml = "# best trial " + std::to_string(best->number) + " of study " + cfg.name() + " (" +
             cfg.metric + " " + config::format_double(best->value) +
             "); run it with: mltrain train " + (sd / "best.yaml").string() + "\n" + folds_line +
             config::to_yaml(config::load_experiment(cfg.train_config(), ov));
    } else {
      yaml = "# best trial " + std::to_string(best->number) + " of study " + cfg.name() + " (" +
             cfg.metric + " " + config::format_double(best->value) + ")\n" + folds_line;
      for (auto it = best->params.begin(); it != best->params.end(); ++it)
        yaml += it.key() + ": " + it.value().dump() + "\n";
    }
    write_file_atomic((sd / "best.yaml").string(), yaml);
    s["best_yaml"] = (sd / "best.yaml").string();
  }
  const auto imp = parameter_importance(cfg.space, trials, cfg.maximize);
  s["importance"] = imp;
  write_file_atomic((sd / "importance.json").string(), imp.dump(2) + "\n");

  SvgChart h("optimisation history: " + cfg.name(), "trial", cfg.metric);
  std::vector<double> xs, ys, bx, by;
  double run_best = NAN;
  for (const auto& t : trials) {
    if (t.state != "COMPLETE" || !std::isfinite(t.value)) continue;
    xs.push_back(t.number), ys.push_back(t.value);
    if (!std::isfinite(run_best) || (cfg.maximize ? t.value > run_best : t.value < run_best))
      run_best = t.value;
    bx.push_back(t.number), by.push_back(run_best);
  }
  h.add_series("trial value", xs, ys);
  h.add_series("best so far", bx, by);
  write_file_atomic((sd / "history.svg").string(), h.render());
  std::vector<std::string> labels;
  std::vector<double> vals;
  for (const auto& r : imp) labels.push_back(r["param"]), vals.push_back(r["importance"]);
  write_file_atomic(
      (sd / "importance.svg").string(),
      svg_bars("parameter importance (PED-ANOVA style): " + cfg.name(), labels, vals));
  write_file_atomic((sd / "parallel.svg").string(),
                    svg_parallel("parallel coordinates: " + cfg.name(), cfg.space, trials,
                                 cfg.maximize, cfg.metric));
  s["files"] = {"trials.csv",  "trials.jsonl",   "best.yaml",   "importance.json",
                "history.svg", "importance.svg", "parallel.svg"};
  if (cfg.multi()) {
    write_front(cfg, trials, s);
    s["files"].push_back("pareto.json");
    if (fs::exists(sd / "pareto.svg")) s["files"].push_back("pareto.svg");
  }
  return s;
}

std::string study_text(const nlohmann::json& s) {
  std::ostringstream o;
  o << "study " << s.value("study", "") << " (" << s.value("sampler", "") << " sampler, "
    << s.value("pruner", "") << " pruner): " << s.value("trials", 0)
    << " trials: " << s.value("complete", 0) << " complete, " << s.value("pruned", 0) << " pruned, "
    << s.value("failed", 0) << " failed"
    << (s.value("running", 0) ? ", " + std::to_string(s.value("running", 0)) + " running" : "")
    << "\n";
  if (s.contains("best")) {
    o << "best: trial " << s["best"]["number"] << ", " << s.value("metric", "") << " = "
      << config::format_double(s["best"]["value"].get<double>()) << ", params "
      << s["best"]["params"].dump() << "\n";
    if (s.contains("best_yaml")) o << "best config: " << s["best_yaml"].get<std::string>() << "\n";
  }
  if (s.contains("pareto_front")) {
    o << "Pareto front (" << s["pareto_front"].size() << " trials; hypervolume "
      << config::format_double(s["hypervolume"].get<double>()) << " below "
      << s["hypervolume_reference"].dump() << "):\n";
    for (const auto& f : s["pareto_front"]) {
      o << "  trial " << f["number"].get<int>();
      for (size_t i = 0; i < s["objectives"].size(); ++i)
        o << "  " << s["objectives"][i]["metric"].get<std::string>() << " "
          << config::format_double(f["values"][i].get<double>());
      o << "  " << f["params"].dump() << "\n";
    }
  }
  if (!s["importance"].empty()) {
    o << "importance (PED-ANOVA style; Spearman correlation with " << s.value("metric", "")
      << "):\n";
    for (const auto& r : s["importance"])
      o << "  " << r["param"].get<std::string>() << "  "
        << config::format_fixed(r["importance"].get<double>(), 3)
        << (r["spearman"].is_null()
                ? std::string()
                : "  (rho " + config::format_fixed(r["spearman"].get<double>(), 2) + ")")
        << "\n";
  }
  o << "outputs in " << s.value("dir", "") << ":";
  for (const auto& f : s["files"]) o << " " << f.get<std::string>();
  o << "\n";
  return o.str();
}

std::string study_html(const std::string& dir) {
  auto cfg = study_config_from_folder(dir);
  const auto trials = read_trials(cfg.study_dir(), cfg.space);
  const auto s = write_study_outputs(cfg, trials);
  std::ostringstream h;
  h << "<h2>Tuning study " << xml_escape(cfg.name()) << "</h2>\n<p>" << s.value("trials", 0)
    << " trials (" << s.value("complete", 0) << " complete, " << s.value("pruned", 0) << " pruned, "
    << s.value("failed", 0) << " failed); " << xml_escape(cfg.sampler.name) << " sampler, "
    << xml_escape(cfg.pruner.name)
    << " pruner; objective: " << (cfg.maximize ? "maximize " : "minimize ")
    << xml_escape(cfg.metric) << ".";
  if (s.contains("best"))
    h << " Best: trial " << s["best"]["number"].get<int>() << ", " << xml_escape(cfg.metric) << " "
      << config::format_double(s["best"]["value"].get<double>()) << ", "
      << xml_escape(s["best"]["params"].dump()) << ".";
  h << "</p>\n<div class=\"grid\">\n";
  for (const char* f : {"history.svg", "importance.svg", "parallel.svg", "pareto.svg"})
    if (fs::exists(cfg.study_dir() / f))  // pareto.svg: studies of several objectives
      h << "<figure>" << read_file((cfg.study_dir() / f).string()) << "</figure>\n";
  h << "</div>\n";
  if (!s["importance"].empty()) {
    h << "<table><tr><th>parameter</th><th>importance</th><th>Spearman rho with "
      << xml_escape(cfg.metric) << "</th></tr>\n";
    for (const auto& r : s["importance"])
      h << "<tr><td>" << xml_escape(r["param"].get<std::string>()) << "</td><td>"
        << config::format_fixed(r["importance"].get<double>(), 3) << "</td><td>"
        << (r["spearman"].is_null() ? "-" : config::format_fixed(r["spearman"].get<double>(), 2))
        << "</td></tr>\n";
    h << "</table>\n";
  }
  return h.str();
}

}  // namespace mltrain::tune
