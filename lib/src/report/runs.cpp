#include "mltrain/report/runs.hpp"

#include <signal.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mltrain/config/experiment.hpp"
#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/svg.hpp"
#include "mltrain/train/checkpoint.hpp"

namespace fs = std::filesystem;

namespace mltrain::report {
using config::format_fixed;
namespace {

std::vector<nlohmann::json> read_metrics(const fs::path& dir, int64_t* torn = nullptr) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const std::exception&) {  // a line cut by a crash: the rest is still good, counted
      if (torn) ++*torn;
    }
  }
  return out;
}

std::string duration(double s) {
  const int64_t t = static_cast<int64_t>(std::llround(s));
  char b[32];
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(b, sizeof b, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(b, sizeof b, "%llds", (long long)t);
  return b;
}

bool is_run_dir(const fs::path& d) {
  return fs::exists(d / "status.json") || fs::exists(d / "metrics.jsonl");
}

// config.yaml flattened to "a.b.c" -> value text.
void flatten(const YAML::Node& n, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n)
      flatten(
          kv.second,
          prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>(),
          out);
  } else if (n.IsSequence()) {
    YAML::Emitter e;
    e << YAML::Flow << n;
    out[prefix] = e.c_str();
  } else if (n.IsScalar()) {
    out[prefix] = n.as<std::string>();
  } else {
    out[prefix] = "";
  }
}

}  // namespace

// The metric the run monitors (its config's checkpoint.monitor, eval_ dropped as in the eval
// records); a run without a readable config: accuracy when its evaluations have it, else loss.
static void monitored_metric(const fs::path& dir, const std::vector<nlohmann::json>& metrics,
                             RunInfo& r) {
  try {
    const auto cfg = config::load_experiment((dir / "config.yaml").string(), {});
    std::string m = config::checkpoint_monitor(cfg);
    r.maximize = config::checkpoint_mode(cfg) == "max";
    if (m.rfind("eval_", 0) == 0) m = m.substr(5);
    if (m != "train_loss") {
      r.metric = m;
      return;
    }
  } catch (const std::exception&) {
  }
  r.metric = "loss";
  for (const auto& m : metrics)
    if (m.value("event", "") == "eval" && m.contains("accuracy")) r.metric = "accuracy";
  r.maximize = config::metric_mode(r.metric) == "max";
}

std::string RunInfo::best_text() const {
  if (std::isnan(best)) return "-";
  const bool share = metric.find("accuracy") != std::string::npos;
  char v[32];
  std::snprintf(v, sizeof v, "%.4g", best);
  return metric + " " + (share ? format_fixed(100 * best, 2) + "%" : std::string(v));
}

RunInfo read_run(const fs::path& dir) {
  RunInfo r;
  r.dir = dir;
  r.name = dir.parent_path().filename().string() + "/" + dir.filename().string();
  r.state = "unknown";
  try {
    std::ifstream in(dir / "status.json");
    if (in) {
      const auto j = nlohmann::json::parse(in);
      r.state = j.value("state", "unknown");
      r.step = j.value("step", int64_t{0});
      r.detail = j.value("detail", "");
      const int pid = j.value("pid", 0);
      if (r.state == "running" && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
        r.state = "killed";  // status.json was never updated: the step comes from the files
        r.detail = "killed, pid " + std::to_string(pid) + " gone";
      }
    }
  } catch (const std::exception&) {
    r.detail = "unreadable status.json";
  }
  int64_t torn = 0;
  const auto metrics = read_metrics(dir, &torn);
  monitored_metric(dir, metrics, r);
  for (const auto& m : metrics) {
    const std::string ev = m.value("event", "");
    if (ev == "eval" && m.contains(r.metric) && m[r.metric].is_number()) {
      const double v = m[r.metric].get<double>();
      if (std::isnan(r.best) || (r.maximize ? v > r.best : v < r.best))
        r.best = v, r.best_step = m.value("step", int64_t{0});
    }
    if (ev == "train" || ev == "eval") r.seconds = std::max(r.seconds, m.value("time_s", 0.0));
    if (ev == "summary") r.seconds = m.value("train_seconds", r.seconds);
    if (m.contains("step") && r.state == "unknown")
      r.step = std::max(r.step, m.value("step", int64_t{0}));
  }
  const auto complete = train::CheckpointStore::list_complete(dir / "checkpoints");
  r.checkpoints = static_cast<int>(complete.size());
  if (r.state == "killed") {  // "interrupted at step k": the last record, and where it resumes
    r.state = "interrupted";
    for (const auto& m : metrics) r.step = std::max(r.step, m.value("step", int64_t{0}));
    const std::string last = complete.empty() ? "" : complete.back().filename().string();
    r.detail += "; " + (last.empty() ? std::string("no checkpoint, restarts from step 0")
                                     : "resumes from " + last);  // sorted by step
  }
  if (r.state == "interrupted")
    r.detail = "interrupted at step " + std::to_string(r.step) +
               (r.detail.empty() ? "" : " (" + r.detail + ")");
  if (torn > 0)
    r.detail += (r.detail.empty() ? "" : "; ") + std::to_string(torn) + " torn metrics line(s)";
  return r;
}

std::vector<RunInfo> find_runs(const fs::path& root) {
  std::vector<RunInfo> out;
  if (!fs::exists(root))
    throw DataError(root.string(), "no such folder",
                    "give the runs folder (run.dir, default runs/)");
  if (is_run_dir(root)) return {read_run(root)};
  for (const auto& name : fs::directory_iterator(root)) {
    if (!name.is_directory()) continue;
    for (const auto& v : fs::directory_iterator(name.path()))
      if (v.is_directory() && is_run_dir(v.path())) out.push_back(read_run(v.path()));
  }
  std::sort(out.begin(), out.end(),
            [](const RunInfo& a, const RunInfo& b) { return a.name < b.name; });
  return out;
}

std::string runs_table(const std::vector<RunInfo>& runs) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line, "%-34s %-12s %-22s %8s %10s %6s  %s\n", "run", "status",
                "best (monitored)", "steps", "time", "ckpts", "detail");
  o << line;
  for (const auto& r : runs) {
    const std::string best = r.best_text();
    std::snprintf(line, sizeof line, "%-34s %-12s %-22s %8lld %10s %6d  %s\n", r.name.c_str(),
                  r.state.c_str(), best.c_str(), (long long)r.step, duration(r.seconds).c_str(),
                  r.checkpoints, r.detail.substr(0, 120).c_str());
    o << line;
  }
  if (runs.empty()) o << "(no runs)\n";
  return o.str();
}

namespace {

struct LoadedRun {
  RunInfo info;
  std::vector<nlohmann::json> metrics;
  std::map<std::string, std::string> config;  // flattened resolved config.yaml
};

LoadedRun load_run(const fs::path& d) {
  if (!is_run_dir(d))
    throw DataError(d.string(), "not a run folder (no status.json or metrics.jsonl)",
                    "give runs/<name>/v<N>; `mltrain runs` lists them");
  LoadedRun l{read_run(d), read_metrics(d), {}};
  try {
    if (fs::exists(d / "config.yaml"))
      flatten(YAML::LoadFile((d / "config.yaml").string()), "", l.config);
  } catch (const std::exception& e) {
    throw DataError((d / "config.yaml").string(), std::string("unreadable: ") + e.what());
  }
  return l;
}

// One chart of a metrics field over optimizer steps, a series per run ("" when no run has it).
std::string chart(const std::vector<LoadedRun>& runs, const std::string& title,
                  const std::string& event, const std::string& field, const std::string& ylabel) {
  SvgChart c(title, "optimizer step", ylabel);
  bool any = false;
  for (const auto& r : runs) {
    std::vector<double> xs, ys;
    for (const auto& m : r.metrics)
      if (m.value("event", "") == event && m.contains(field) && m[field].is_number()) {
        xs.push_back(m.value("step", 0.0));
        ys.push_back(m[field].get<double>());
      }
    if (!xs.empty()) any = true;
    c.add_series(r.info.name, xs, ys);
  }
  return any ? "<figure>" + c.render(560, 320) + "</figure>\n" : std::string();
}

void runs_table_html(const std::vector<LoadedRun>& runs, std::ostream& h) {
  h << "<h2>Runs</h2>\n<table><tr><th>run</th><th>status</th><th>best monitored metric</th><th>at "
       "step</th><th>steps</th>"
       "<th>training time</th><th>checkpoints</th><th>folder</th></tr>\n";
  for (const auto& r : runs) {
    const auto& i = r.info;
    h << "<tr><td>" << xml_escape(i.name) << "</td><td class=\"" << xml_escape(i.state) << "\">"
      << xml_escape(i.state) << (i.detail.empty() ? "" : ": " + xml_escape(i.detail)) << "</td><td>"
      << xml_escape(i.best_text()) << "</td><td>"
      << (i.best_step >= 0 ? std::to_string(i.best_step) : "-") << "</td><td>" << i.step
      << "</td><td>" << duration(i.seconds) << "</td><td>" << i.checkpoints << "</td><td>"
      << xml_escape(i.dir.string()) << "</td></tr>\n";
  }
  h << "</table>\n";
}

void curves_html(const std::vector<LoadedRun>& runs, std::ostream& h) {
  h << "<h2>Curves</h2>\n<div class=\"grid\">\n"
    << chart(runs, "training loss", "train", "loss", "loss")
    << chart(runs, "evaluation accuracy", "eval", "accuracy", "accuracy")
    << chart(runs, "evaluation loss", "eval", "loss", "loss")
    << chart(runs, "learning rate", "train", "lr", "lr")
    << chart(runs, "gradient norm (before clipping)", "train", "grad_norm", "L2 norm")
    << chart(runs, "throughput", "train", "samples_per_s", "samples/s")
    << chart(runs, "data-wait share of the step", "train", "data_wait", "share")
    << chart(runs, "loss scale (fp16)", "train", "loss_scale", "scale")
    << chart(runs, "throughput (language models)", "train", "tokens_per_s", "tokens/s");
  // Every other metric the runs' tasks report on the held-out split (r2, roc_auc_macro, ...).
  std::set<std::string> task_metrics;
  const std::set<std::string> shown = {"event",    "step",          "epoch",  "loss",
                                       "accuracy", "samples_per_s", "time_s", "samples"};
  for (const auto& r : runs)
    for (const auto& m : r.metrics)
      if (m.value("event", "") == "eval")
        for (const auto& [k, v] : m.items())
          if (v.is_number() && !shown.count(k) && k.rfind("roc_auc_class", 0) != 0)
            task_metrics.insert(k);
  for (const auto& k : task_metrics) h << chart(runs, "evaluation " + k, "eval", k, k);
  h << "</div>\n";
}

// Settings that differ between the runs (all of them for a single run would be noise).
void config_differences_html(const std::vector<LoadedRun>& runs, std::ostream& h) {
  std::set<std::string> keys;
  for (const auto& r : runs)
    for (const auto& [k, v] : r.config) keys.insert(k);
  auto value = [](const LoadedRun& r, const std::string& k) {
    return r.config.count(k) ? r.config.at(k) : std::string("(absent)");
  };
  std::vector<std::string> differing;
  for (const auto& k : keys) {
    std::set<std::string> vals;
    for (const auto& r : runs) vals.insert(value(r, k));
    if (vals.size() > 1) differing.push_back(k);
  }
  h << "<h2>Config differences</h2>\n";
  if (runs.size() < 2) {
    h << "<p>One run: nothing to compare. Its resolved config is in "
      << xml_escape((runs[0].info.dir / "config.yaml").string()) << ".</p>\n";
    return;
  }
  if (differing.empty()) {
    h << "<p>The runs' resolved configs are identical.</p>\n";
    return;
  }
  h << "<table><tr><th>key</th>";
  for (const auto& r : runs) h << "<th>" << xml_escape(r.info.name) << "</th>";
  h << "</tr>\n";
  for (const auto& k : differing) {
    h << "<tr><td>" << xml_escape(k) << "</td>";
    for (const auto& r : runs) h << "<td>" << xml_escape(value(r, k)) << "</td>";
    h << "</tr>\n";
  }
  h << "</table>\n";
}

void checkpoints_html(const std::vector<LoadedRun>& runs, std::ostream& h) {
  h << "<h2>Checkpoints</h2>\n<table><tr><th>run</th><th>checkpoint</th><th>step</"
       "th><th>monitor</th><th>size</th></tr>\n";
  for (const auto& r : runs) {
    const fs::path cdir = r.info.dir / "checkpoints";
    std::error_code ec;
    std::string latest;
    {
      std::ifstream in(cdir / "latest");
      std::getline(in, latest);
    }
    for (const auto& c : train::CheckpointStore::list_complete(cdir)) {
      double bytes = 0, monitor = NAN;
      int64_t step = 0;
      for (const auto& f : fs::directory_iterator(c, ec))
        if (f.is_regular_file()) bytes += static_cast<double>(f.file_size());
      try {
        std::ifstream in(c / "trainer.json");
        const auto j = nlohmann::json::parse(in);
        step = j.value("step", int64_t{0});
        monitor = j.value("monitor", NAN);
      } catch (const std::exception&) {
      }
      const std::string n = c.filename().string();
      h << "<tr><td>" << xml_escape(r.info.name) << "</td><td>" << xml_escape(n)
        << (n == latest ? " (latest)" : "") << "</td><td>" << step << "</td><td>"
        << (std::isfinite(monitor) ? format_fixed(monitor, 4) : "-") << "</td><td>"
        << format_fixed(bytes / 1e6, 2) << " MB</td></tr>\n";
    }
  }
  h << "</table>\n";
}

}  // namespace

std::string html_report(const std::vector<fs::path>& dirs,
                        const std::vector<std::string>& sections) {
  if (dirs.empty() && sections.empty())
    throw ConfigError("report", "no run or study folders given",
                      "mltrain report runs/<name>/v0 [more runs or runs/tune/<study>...]");
  std::vector<LoadedRun> runs;
  for (const auto& d : dirs) runs.push_back(load_run(d));
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>mltrain "
       "report</title>\n"
       "<style>body{font-family:sans-serif;margin:24px;color:#222;background:#fff}h1{font-size:"
       "22px}"
       "h2{font-size:17px;margin-top:28px;border-bottom:1px solid "
       "#ccc}table{border-collapse:collapse;font-size:13px}"
       "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f2f2f2}"
       ".grid{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0;border:1px solid #ddd}"
       ".finished{color:#2a7d2a}.failed,.stale{color:#b22}.interrupted,.running{color:#b70}</"
       "style></head><body>\n";
  h << "<h1>mltrain report: " << runs.size() << " run" << (runs.size() == 1 ? "" : "s");
  if (!sections.empty())
    h << ", " << sections.size() << " tuning stud" << (sections.size() == 1 ? "y" : "ies");
  h << "</h1>\n";
  for (const auto& sec : sections) h << sec;
  if (!runs.empty()) {
    runs_table_html(runs, h);
    curves_html(runs, h);
    config_differences_html(runs, h);
    checkpoints_html(runs, h);
  }
  h << "<p style=\"font-size:12px;color:#777\">Written by mltrain report; self-contained (no "
       "scripts, fonts or "
       "requests).</p>\n</body></html>\n";
  return h.str();
}

}  // namespace mltrain::report
