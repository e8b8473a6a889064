#include "mltrain/tune/folds.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "mltrain/core/process.hpp"

namespace fs = std::filesystem;

namespace mltrain::tune {

void mean_std(const std::vector<double>& v, double& mean, double& sd) {
  mean = v.empty() ? NAN : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  sd = v.size() > 1 ? std::sqrt(ss / double(v.size() - 1)) : 0.0;
}

namespace {

struct Fold {
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  bool open = true;
  int status = 0;
  std::map<std::string, double> last;  // metric -> last value
  std::string log;
};

nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nullptr; }

}  // namespace

namespace {

std::vector<Fold> spawn_folds(const FoldGroupOptions& o) {
  std::vector<Fold> folds(size_t(o.folds));
  if (!o.log_dir.empty()) fs::create_directories(o.log_dir);
  for (int i = 0; i < o.folds; ++i) {
    auto argv = o.argv;
    if (o.train_overrides) {
      argv.push_back("data.folds=" + std::to_string(o.folds));
      argv.push_back("data.fold=" + std::to_string(i));
      argv.push_back("data.fold_seed=" + std::to_string(o.seed));
      argv.push_back("run.name=" + o.run_name + "_f" + std::to_string(i));
    }
    auto& f = folds[size_t(i)];
    if (!o.log_dir.empty())
      f.log = (fs::path(o.log_dir) / ("fold" + std::to_string(i) + ".log")).string();
    f.pid = spawn_child(argv,
                        environment_with({"MLTRAIN_FOLD=" + std::to_string(i),
                                          "MLTRAIN_FOLDS=" + std::to_string(o.folds),
                                          "MLTRAIN_FOLD_SEED=" + std::to_string(o.seed)}),
                        &f.fd, f.log, /*own_group=*/false);
  }
  return folds;
}

// The folds' JSON lines, merged: a step is printed (as the folds' mean) once every fold has
// reported it for every metric, in step order.
class StepMerger {
 public:
  StepMerger(const FoldGroupOptions& o, std::vector<Fold>& folds) : o_(o), folds_(folds) {}

  void line(size_t i, const std::string& text) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (...) {
      return;
    }
    if (!j.is_object()) return;
    for (const auto& m : o_.metrics) {
      if (!j.contains(m) || !(j[m].is_number() || j[m].is_null())) continue;
      const double v = j[m].is_number() ? j[m].get<double>() : NAN;
      folds_[i].last[m] = v;
      if (!j.contains("step") || !j["step"].is_number_integer()) continue;
      const int64_t s = j["step"].get<int64_t>();
      auto& vals = steps_[s][m];
      auto& got = seen_[s][m];
      if (vals.empty()) vals.assign(folds_.size(), NAN), got.assign(folds_.size(), false);
      vals[i] = v, got[i] = true;
    }
    flush();
  }

 private:
  void flush() {
    while (!steps_.empty()) {
      auto& [s, per] = *steps_.begin();
      bool all = per.size() == o_.metrics.size();
      for (auto& [m, g] : seen_[s])
        for (bool b : g) all = all && b;
      if (!all) return;
      nlohmann::json out = {{"step", s}};
      for (auto& [m, v] : per) {
        double mean, sd;
        mean_std(v, mean, sd);
        out[m] = number_or_null(mean);
        out[m + "_folds"] = v;
      }
      std::cout << out.dump() << std::endl;
      seen_.erase(s);
      steps_.erase(steps_.begin());
    }
  }

  const FoldGroupOptions& o_;
  std::vector<Fold>& folds_;
  std::map<int64_t, std::map<std::string, std::vector<double>>> steps_;  // step -> metric -> folds
  std::map<int64_t, std::map<std::string, std::vector<bool>>> seen_;
};

// Reads every fold's stdout until all are closed.
void read_folds(std::vector<Fold>& folds, StepMerger& merger) {
  size_t open = folds.size();
  while (open > 0) {
    std::vector<pollfd> p;
    std::vector<size_t> who;
    for (size_t i = 0; i < folds.size(); ++i)
      if (folds[i].open) p.push_back({folds[i].fd, POLLIN, 0}), who.push_back(i);
    ::poll(p.data(), p.size(), 1000);
    for (size_t k = 0; k < p.size(); ++k) {
      if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Fold& f = folds[who[k]];
      char buf[4096];
      const ssize_t n = ::read(f.fd, buf, sizeof buf);
      if (n <= 0) {
        f.open = false, --open;
        ::close(f.fd);
        if (!f.buf.empty()) merger.line(who[k], f.buf), f.buf.clear();
        continue;
      }
      f.buf.append(buf, size_t(n));
      size_t nl;
      while ((nl = f.buf.find('\n')) != std::string::npos) {
        const std::string line = f.buf.substr(0, nl);
        f.buf.erase(0, nl + 1);
        merger.line(who[k], line);
      }
    }
  }
}

// A failed fold: its status and last log line, and mltrain's "error:"/"  fix:" lines passed
// through; returns the group's exit status (the fold's own when it exited, 2 for its
// configuration; else 1).
int report_failure(const FoldGroupOptions& o, const Fold& f, int which) {
  std::string tail, error_lines;
  if (!f.log.empty()) {
    std::ifstream in(f.log);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) tail = line;
      if (line.rfind("error: ", 0) == 0 || line.rfind("  fix: ", 0) == 0)
        error_lines += line + "\n";
    }
  }
  std::cerr << "fold " << which << " of " << o.folds << " failed ("
            << (WIFSIGNALED(f.status) ? "signal " + std::to_string(WTERMSIG(f.status))
                                      : "exit status " + std::to_string(WEXITSTATUS(f.status)))
            << ")" << (tail.empty() ? "" : ": " + tail) << (f.log.empty() ? "" : "; log: " + f.log)
            << "\n"
            << error_lines;
  return WIFEXITED(f.status) ? WEXITSTATUS(f.status) : 1;
}

}  // namespace

int run_fold_group(const FoldGroupOptions& o) {
  auto folds = spawn_folds(o);
  StepMerger merger(o, folds);
  read_folds(folds, merger);
  int failed = -1;
  for (size_t i = 0; i < folds.size(); ++i) {
    ::waitpid(folds[i].pid, &folds[i].status, 0);
    if (failed < 0 && !(WIFEXITED(folds[i].status) && WEXITSTATUS(folds[i].status) == 0))
      failed = int(i);
  }
  if (failed >= 0) return report_failure(o, folds[size_t(failed)], failed);
  nlohmann::json final_line = nlohmann::json::object();
  nlohmann::json summary = {{"event", "summary"}, {"folds", nlohmann::json::object()}};
  for (const auto& m : o.metrics) {
    std::vector<double> v;
    for (const auto& f : folds) v.push_back(f.last.count(m) ? f.last.at(m) : NAN);
    double mean, sd;
    mean_std(v, mean, sd);
    final_line[m] = number_or_null(mean);
    summary["folds"][m] = v;
    summary[m + "_mean"] = number_or_null(mean);
    summary[m + "_std"] = number_or_null(sd);
  }
  std::cout << summary.dump() << "\n" << final_line.dump() << std::endl;
  return 0;
}

}  // namespace mltrain::tune
