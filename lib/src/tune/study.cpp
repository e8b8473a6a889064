#include "mltrain/tune/study.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/json.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/core/signals.hpp"
#include "mltrain/tune/analysis.hpp"
#include "mltrain/tune/functions.hpp"
#include "mltrain/tune/journal.hpp"
#include "mltrain/tune/pareto.hpp"

namespace fs = std::filesystem;

namespace mltrain::tune {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  return h;
}

struct Replay {
  std::vector<TrialState> trials;
  std::map<std::string, double> heartbeat;  // worker -> last time
};
void replay_one(Replay& r, const nlohmann::json& j, size_t n_records, const Space& space);

Replay replay(const std::vector<nlohmann::json>& recs, const Space& space) {
  Replay r;
  for (const auto& j : recs) {
    try {  // a record of the wrong shape (edited by hand, another tool's) is skipped, never fatal
      replay_one(r, j, recs.size(), space);
    } catch (const nlohmann::json::exception&) {
    }
  }
  return r;
}

// The replayed state kept up to date with a journal's records (only new records are applied).
struct LiveReplay {
  Replay state;
  size_t applied = 0;
  const Replay& update(const std::vector<nlohmann::json>& recs, const Space& space) {
    if (recs.size() < applied) state = Replay(), applied = 0;
    for (; applied < recs.size(); ++applied) {
      try {
        replay_one(state, recs[applied], recs.size(), space);
      } catch (const nlohmann::json::exception&) {
      }
    }
    return state;
  }
};

// One journal record into the replayed state. Trial numbers are dense (each has its create
// record), so one past the journal's record count is not a trial: skipped, not allocated.
void replay_one(Replay& r, const nlohmann::json& j, size_t n_records, const Space& space) {
  if (!j.is_object()) return;
  const std::string op = j.value("op", "");
  if (op == "heartbeat") {
    r.heartbeat[j.value("worker", "")] = j.value("t", 0.0);
    return;
  }
  const auto* trial = j.contains("trial") ? &j["trial"] : nullptr;
  if (!trial || !trial->is_number_integer()) return;
  const int64_t n64 = json_int(*trial);
  if (n64 < 0 || uint64_t(n64) >= n_records) return;
  const int n = int(n64);
  if (op == "create") {
    if (!j.contains("params")) return;
    // Every field read before anything changes: a record that throws half-way leaves no trial.
    const std::string worker = j.value("worker", "");
    const int retry_of =
        static_cast<int>(std::clamp<int64_t>(json_int_or(j, "retry_of", -1), -1, INT32_MAX));
    const double started = j.value("t", 0.0);
    if (size_t(n) >= r.trials.size()) r.trials.resize(size_t(n) + 1);
    auto& t = r.trials[size_t(n)];
    t.number = n;
    t.params = j.at("params");
    try {
      t.x = params_from_json(space, t.params);
    } catch (const std::exception&) {
      t.x.clear();  // written by a study with another space: ignored by the sampler
    }
    t.worker = worker;
    t.retry_of = retry_of;
    t.started = started;
    r.heartbeat[t.worker] = std::max(r.heartbeat[t.worker], t.started);
    return;
  }
  if (size_t(n) >= r.trials.size() || r.trials[size_t(n)].number < 0) return;
  auto& t = r.trials[size_t(n)];
  if (op == "report") {
    const double v = j.contains("value") && j["value"].is_number() ? j["value"].get<double>()
                                                                   : NAN;  // NaN is stored as null
    const int64_t step = j.contains("step") && j["step"].is_number_integer()
                             ? json_int(j["step"])
                             : int64_t(t.intermediate.size());
    t.intermediate.emplace_back(step, v);
  } else if (op == "finish" && t.state == "RUNNING") {
    std::string state = j.value("state", "FAIL"), reason = j.value("reason", "");
    const double finished = j.value("t", 0.0);
    t.state = std::move(state);
    t.value = j.contains("value") && j["value"].is_number() ? j["value"].get<double>() : NAN;
    t.values.clear();
    if (j.contains("values") && j["values"].is_array())
      for (const auto& v : j["values"]) t.values.push_back(v.is_number() ? v.get<double>() : NAN);
    t.reason = std::move(reason);
    t.finished = finished;
    if (j.contains("attrs")) t.attrs = j["attrs"];
  }
}

bool pid_alive(int pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// worker id: host:pid:start-time
std::string make_worker_id() {
  return hostname() + ":" + std::to_string(::getpid()) + ":" +
         std::to_string(int64_t(now_s() * 1000));
}

bool worker_dead_here(const std::string& w) {
  const auto a = w.find(':'), b = w.find(':', a + 1);
  if (a == std::string::npos || b == std::string::npos) return false;
  if (w.substr(0, a) != hostname()) return false;  // another machine: only the heartbeat tells
  return !pid_alive(std::atoi(w.substr(a + 1, b - a - 1).c_str()));
}

// ---- trial processes ---------------------------------------------------------------------------

struct Child {
  int number = -1;
  pid_t pid = -1;
  int out_fd = -1;
  std::string buf;
  std::vector<double> values;  // intermediate, as reported
  double last_value = NAN;     // the first objective's
  bool has_value = false;
  std::map<std::string, double> last;  // every objective's latest value
  bool pruned = false;
  double started = 0;
  nlohmann::json attrs = nlohmann::json::object();
  fs::path log;
  std::vector<double> x;  // in-process test functions: the point, and the steps taken
  int steps_done = 0;
};

std::string env_name(const std::string& p) {
  std::string s = "MLTRAIN_PARAM_";
  for (char c : p)
    s += std::isalnum(static_cast<unsigned char>(c))
             ? char(std::toupper(static_cast<unsigned char>(c)))
             : '_';
  return s;
}

std::string value_text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

Child spawn(const StudyConfig& cfg, const RunStudyOptions& opt, const TrialState& t) {
  const fs::path dir = cfg.study_dir() / "trials";
  fs::create_directories(dir);
  char name[32];
  std::snprintf(name, sizeof name, "t%04d", t.number);
  std::vector<std::string> argv;
  if (!cfg.train_config().empty()) {
    argv = {opt.self_exe, "train", cfg.train_config()};
    argv.insert(argv.end(), cfg.overrides().begin(), cfg.overrides().end());
    for (auto it = t.params.begin(); it != t.params.end(); ++it)
      argv.push_back(it.key() + "=" + value_text(it.value()));
    argv.push_back("run.dir=" + dir.string());
    argv.push_back("run.name=" + std::string(name));
    argv.push_back("runtime.threads=" + std::to_string(cfg.threads()));
    argv.push_back("--jsonl");
  } else {
    argv = cfg.command();
    for (auto it = t.params.begin(); it != t.params.end(); ++it)
      argv.push_back("--" + it.key() + "=" + value_text(it.value()));
  }
  if (cfg.folds() > 1) {  // the trial is a fold group: `mltrain tune folds` runs and averages them
    std::vector<std::string> group = {opt.self_exe,
                                      "tune",
                                      "folds",
                                      "--k",
                                      std::to_string(cfg.folds()),
                                      "--seed",
                                      std::to_string(cfg.seed()),
                                      "--metric",
                                      cfg.metric,
                                      "--log-dir",
                                      (dir / (std::string(name) + "_folds")).string()};
    if (!cfg.train_config().empty()) {
      // run.name is the group's: each fold adds _f<i>
      argv.erase(std::remove_if(argv.begin(), argv.end(),
                                [](const std::string& a) { return a.rfind("run.name=", 0) == 0; }),
                 argv.end());
      group.insert(group.end(), {"--train-overrides", "--run-name", std::string(name)});
    }
    group.push_back("--");
    group.insert(group.end(), argv.begin(), argv.end());
    argv = std::move(group);
  }
  std::vector<std::string> set;
  for (auto it = t.params.begin(); it != t.params.end(); ++it)
    set.push_back(env_name(it.key()) + "=" + value_text(it.value()));
  set.push_back("MLTRAIN_TRIAL_NUMBER=" + std::to_string(t.number));
  set.push_back("MLTRAIN_TRIAL_DIR=" + (dir / name).string());
  set.push_back("OMP_NUM_THREADS=" + std::to_string(cfg.threads()));
  Child c;
  c.number = t.number;
  c.started = now_s();
  c.log = dir / (std::string(name) + ".log");
  // Its own process group (pruning signals the trial and its children); dies with this driver.
  c.pid = spawn_child(argv, environment_with(set), &c.out_fd, c.log.string(), /*own_group=*/true);
  return c;
}

std::string last_line(const fs::path& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last.size() > 300 ? last.substr(0, 300) + "..." : last;
}

}  // namespace

std::vector<TrialState> read_trials(const fs::path& study_dir, const Space& space) {
  if (!fs::exists(study_dir / "journal.jsonl"))
    throw DataError(study_dir.string(), "is not a study folder (no journal.jsonl)",
                    "pass the folder `mltrain tune` printed, e.g. runs/tune/<name>");
  Journal j(study_dir / "journal.jsonl");
  const auto& recs = j.read();
  check_journal_format(recs, study_dir / "journal.jsonl");
  return replay(recs, space).trials;
}

namespace {

// The study folder remembers its space: resuming with another space or objective would mix
// incomparable trials. Writes the resolved study.yaml.
void claim_study_folder(const StudyConfig& cfg) {
  const fs::path sd = cfg.study_dir();
  fs::create_directories(sd);
  const fs::path saved = sd / "study.yaml";
  if (fs::exists(saved)) {
    auto what_trials_mean = [](const config::StudyFile& f) {
      config::StudyFile only;
      only.objective = f.objective;
      only.space = f.space;
      return config::to_yaml(only);
    };
    const auto prev = config::load_study_file(saved.string(), {}, nullptr, /*in_folder=*/true);
    if (what_trials_mean(prev) != what_trials_mean(cfg.file))
      throw ConfigError(cfg.source,
                        "study '" + cfg.name() + "' in " + sd.string() +
                            " was created with another space or objective",
                        "use a new study.name, or delete " + sd.string());
  }
  write_file_atomic(saved.string(), config::to_yaml(cfg.file));
}

// Trials that count toward n_trials: all but stale failures that were (or will be) retried.
// Returns the first stale trial still owed a retry (or -1); `used` counts the rest.
int retry_target(const std::vector<TrialState>& ts, int max_retry, int& used) {
  std::map<int, int> retried_by;
  for (const auto& t : ts)
    if (t.retry_of >= 0) retried_by[t.retry_of] = t.number;
  // A trial its driver handed back on a stop signal (scancel, requeue, preemption) was not at
  // fault: it is always retried, and it does not use up a retry of max_retry.
  auto handed_back = [&](int n) {
    return ts[size_t(n)].reason.find("handed back") != std::string::npos;
  };
  auto depth = [&](int n) {
    int d = 0;
    while (n >= 0 && ts[size_t(n)].retry_of >= 0) {
      n = ts[size_t(n)].retry_of;
      d += !handed_back(n);
    }
    return d;
  };
  int target = -1;
  used = 0;
  for (const auto& t : ts) {
    if (t.number < 0) continue;
    const bool stale = t.state == "FAIL" && t.reason.rfind("stale", 0) == 0;
    if (stale && retried_by.count(t.number)) continue;  // replaced by its retry
    if (stale && (handed_back(t.number) || depth(t.number) < max_retry)) {
      if (target < 0) target = t.number;
      continue;  // its retry will take its place
    }
    ++used;
  }
  return target;
}

// One driver process of a study. Its loop has four steps: start trials while slots are free (one
// journal transaction each), read the trials' output, reap exits, heartbeat.
class Driver {
 public:
  Driver(const StudyConfig& cfg, const RunStudyOptions& opt)
      : cfg_(cfg),
        opt_(opt),
        journal_(cfg.study_dir() / "journal.jsonl"),
        sampler_(make_sampler(cfg.sampler, cfg.space)),
        pruner_(make_pruner(cfg.pruner)),
        me_(make_worker_id()),
        fn_(cfg.function().empty() ? nullptr : find_test_function(cfg.function())),
        sign_(cfg.maximize ? -1.0 : 1.0),
        t0_(now_s()) {}

  nlohmann::json run() {
    // A new journal starts with its format; an existing one must be of this format.
    journal_.transact([&](const std::vector<nlohmann::json>& recs) {
      check_journal_format(recs, cfg_.study_dir() / "journal.jsonl");
      return recs.empty() ? std::vector<nlohmann::json>{journal_header()}
                          : std::vector<nlohmann::json>{};
    });
    while (true) {
      if (const int sig = stop_signal()) hand_back(sig);
      const bool time_left = cfg_.timeout_s() <= 0 || now_s() - t0_ < cfg_.timeout_s();
      bool started = false, done = done_;
      if (int(running_.size()) < cfg_.max_concurrent() && time_left && !exhausted_ && !done_) {
        started = start_next(&done);
        done_ = done && fn_;    // in-process: nothing else can add work (processes: a stale retry)
        if (started) continue;  // fill every free slot before waiting
      }
      if (fn_ && !running_.empty()) {
        advance_functions();
        continue;
      }
      if (running_.empty()) {
        if (done || exhausted_ || !time_left) break;
        // Other drivers hold the remaining trials: wait for them to finish (or go stale).
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        continue;
      }
      read_output();
      reap();
      if (!config_error_.first.empty()) {
        for (auto& [n, c] : running_) {
          ::kill(-c.pid, SIGTERM);
          finish(c, "FAIL", NAN, "study stopped: another trial's configuration error");
        }
        for (auto& [n, c] : running_) ::waitpid(c.pid, nullptr, 0);
        running_.clear();
        throw ConfigError(cfg_.source, config_error_.first, config_error_.second);
      }
      if (!running_.empty() && now_s() - last_beat_ >= cfg_.heartbeat_s()) {
        journal_.append({{{"op", "heartbeat"}, {"worker", me_}, {"t", now_s()}}});
        last_beat_ = now_s();
      }
    }
    return summary();
  }

 private:
  std::vector<Observation> observations(const std::vector<TrialState>& ts) const {
    std::vector<Observation> obs;
    for (const auto& t : ts) {
      if (t.x.empty()) continue;
      Observation o;
      o.number = t.number;
      o.x = t.x;
      if (t.state == "COMPLETE" && std::isfinite(t.value)) {
        o.value = sign_ * t.value;
        if (cfg_.multi()) {
          o.values = signed_values(t.values);
          if (o.values.size() != cfg_.objectives.size()) continue;
        }
      } else if (t.state == "PRUNED" && !t.intermediate.empty()) {
        o.value = sign_ * t.intermediate.back().second;
        o.pruned = true;
        o.reports = int64_t(t.intermediate.size());
      } else if (t.state == "RUNNING") {
        o.running = true;
      } else {
        continue;
      }
      obs.push_back(std::move(o));
    }
    return obs;
  }

  // Several objectives in minimisation sense (maximised ones negated).
  std::vector<double> signed_values(const std::vector<double>& v) const {
    std::vector<double> out;
    for (size_t i = 0; i < v.size() && i < cfg_.objectives.size(); ++i)
      out.push_back(cfg_.objectives[i].maximize ? -v[i] : v[i]);
    return out;
  }

  // In-process test functions run as if on max_concurrent workers. A plain function is one step:
  // the oldest running trial finishes, so every suggestion sees max_concurrent - 1 pending trials.
  // A learning-curve function reports one value per step: every running trial takes a step (and
  // is judged by the pruner), and finishes at its last step.
  void advance_functions() {
    if (fn_->steps == 0) {
      Child& c = running_.begin()->second;
      const double v = fn_->f(c.x);
      if (fn_->fm) {
        const auto vs = fn_->fm(c.x);
        for (size_t i = 0; i < vs.size(); ++i) c.last[cfg_.objectives[i].metric] = vs[i];
      }
      finish(c, std::isfinite(v) ? "COMPLETE" : "FAIL", v,
             std::isfinite(v) ? "" : "diverged (value not finite)");
      running_.erase(running_.begin());
      return;
    }
    for (auto it = running_.begin(); it != running_.end();) {
      Child& c = it->second;
      const double v = fn_->curve(c.x, ++c.steps_done);
      c.last_value = v, c.has_value = true, c.last[cfg_.metric] = v;
      report(c, c.steps_done, v, /*judge=*/true);
      if (c.pruned || c.steps_done >= fn_->steps) {
        judge_exit(c, 0);
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Several objectives: a running trial whose latest values (those reported so far) no complete
  // trial dominates is on the current front, and no pruner stops it. Complete trials enter with
  // the first objective as they reported it at the same report (the others as they ended).
  bool on_front(const Child& c, const std::vector<TrialState>& trials) const {
    if (!cfg_.multi()) return false;
    std::vector<size_t> known;
    std::vector<double> mine;
    for (size_t i = 0; i < cfg_.objectives.size(); ++i) {
      const auto it = c.last.find(cfg_.objectives[i].metric);
      if (it == c.last.end() || !std::isfinite(it->second)) continue;
      known.push_back(i);
      mine.push_back(cfg_.objectives[i].maximize ? -it->second : it->second);
    }
    if (known.empty()) return false;
    const size_t k = c.values.size();  // the report being judged
    for (const auto& t : trials) {
      if (t.state != "COMPLETE" || t.values.size() != cfg_.objectives.size()) continue;
      // The first objective (the one reported per step) at the same report, as pruners compare.
      auto at_k = t.values;
      if (k > 0 && t.intermediate.size() >= k) at_k[0] = t.intermediate[k - 1].second;
      const auto sv = signed_values(at_k);
      std::vector<double> theirs;
      for (size_t i : known) theirs.push_back(sv[i]);
      if (dominates(theirs, mine)) return false;
    }
    return true;
  }

  // An intermediate value: into the journal, then (judge) the pruner's verdict on the trial.
  void report(Child& c, const nlohmann::json& step, double v, bool judge) {
    c.values.push_back(v);
    journal_.append({{{"op", "report"}, {"trial", c.number}, {"step", step}, {"value", v}}});
    if (!judge) return;
    TrialCurve mine{c.number, false, false, {}};
    for (double x : c.values) mine.values.push_back(sign_ * x);
    const auto& trials = live_.update(journal_.read(), cfg_.space).trials;
    if (pruner_->should_prune(mine, curves(trials)) && !on_front(c, trials)) {
      c.pruned = true;
      if (c.pid > 0) ::kill(-c.pid, SIGTERM);
    }
  }

  std::vector<TrialCurve> curves(const std::vector<TrialState>& ts) const {
    std::vector<TrialCurve> cs;
    for (const auto& t : ts) {
      TrialCurve c{
          t.number, t.state == "COMPLETE" || t.state == "PRUNED", t.state == "COMPLETE", {}};
      for (const auto& [s, v] : t.intermediate) c.values.push_back(sign_ * v);
      cs.push_back(std::move(c));
    }
    return cs;
  }

  // Stale trials (RUNNING under a driver that is gone) become FAIL records.
  std::vector<nlohmann::json> fail_stale(Replay& rp) const {
    std::vector<nlohmann::json> add;
    for (auto& t : rp.trials)
      if (t.number >= 0 && t.state == "RUNNING" && t.worker != me_ &&
          (worker_dead_here(t.worker) || now_s() - rp.heartbeat[t.worker] > cfg_.stale_after_s())) {
        add.push_back({{"op", "finish"},
                       {"trial", t.number},
                       {"state", "FAIL"},
                       {"t", now_s()},
                       {"reason", "stale: driver " + t.worker + " stopped"}});
        t.state = "FAIL", t.reason = "stale";
      }
    return add;
  }

  // One journal transaction: fail stale trials, then create the next trial (a retry first, else
  // the sampler's suggestion) unless the budget is spent (*done) or the grid is exhausted.
  bool start_next(bool* done) {
    TrialState next;
    bool started = false;
    journal_.transact([&](const std::vector<nlohmann::json>& recs) {
      auto rp = replay(recs, cfg_.space);
      std::vector<nlohmann::json> add = fail_stale(rp);
      int used = 0;
      const int retry = retry_target(rp.trials, cfg_.max_retry(), used);
      if (used >= cfg_.n_trials() && retry < 0) {
        *done = true;
        return add;
      }
      if (used + (retry >= 0 ? 1 : 0) > cfg_.n_trials()) return add;
      next = TrialState();
      next.number = int(rp.trials.size());
      if (retry >= 0) {
        next.params = rp.trials[size_t(retry)].params;
        next.x = rp.trials[size_t(retry)].x;
        next.retry_of = retry;
      } else {
        const auto s0 = std::chrono::steady_clock::now();
        auto x = sampler_->sample(cfg_.space, observations(rp.trials), cfg_.seed(), next.number);
        last_sample_s_ =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
        sampler_s_ += last_sample_s_;
        ++sampled_;
        if (!x) {
          exhausted_ = true;
          return add;
        }
        next.x = *x;
        next.params = params_json(cfg_.space, *x);
      }
      nlohmann::json cr = {{"op", "create"},
                           {"trial", next.number},
                           {"params", next.params},
                           {"worker", me_},
                           {"t", now_s()}};
      if (next.retry_of >= 0)
        cr["retry_of"] = next.retry_of;
      else
        cr["sample_ms"] = 1000.0 * last_sample_s_;  // the sampler's time for this suggestion
      add.push_back(cr);
      started = true;
      return add;
    });
    if (!started) return false;
    if (!opt_.quiet)
      std::cerr << "[tune] trial " << next.number << " " << next.params.dump()
                << (next.retry_of >= 0 ? " (retry of " + std::to_string(next.retry_of) + ")" : "")
                << "\n";
    if (fn_) {  // in-process test function: advance_functions() runs it
      Child c;
      c.number = next.number;
      c.x = next.x;
      c.started = now_s();
      running_[next.number] = std::move(c);
    } else {
      running_[next.number] = spawn(cfg_, opt_, next);
    }
    return true;
  }

  void finish(Child& c, const std::string& state, double value, const std::string& reason) {
    nlohmann::json r = {{"op", "finish"}, {"trial", c.number}, {"state", state},
                        {"t", now_s()},   {"reason", reason},  {"attrs", c.attrs}};
    if (std::isfinite(value)) r["value"] = value;
    if (cfg_.multi() && state == "COMPLETE") {
      nlohmann::json vs = nlohmann::json::array();
      for (const auto& o : cfg_.objectives) vs.push_back(c.last.at(o.metric));
      r["values"] = vs;
    }
    journal_.append({r});
    if (opt_.quiet) return;
    std::ostringstream m;
    m << "[tune] trial " << c.number << " " << state;
    if (cfg_.multi() && state == "COMPLETE")
      for (const auto& o : cfg_.objectives) m << " " << o.metric << "=" << c.last.at(o.metric);
    else if (std::isfinite(value))
      m << " " << cfg_.metric << "=" << value;
    if (!reason.empty()) m << " (" << reason << ")";
    std::cerr << m.str() << "\n";
  }

  // One JSON line from a trial: the summary's fields become attributes; a value of the metric is
  // the latest result, and with a step also an intermediate report, which the pruner judges
  // against every trial's curve (judge=false once the trial has exited).
  void handle_line(Child& c, const std::string& line, bool judge) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (...) {
      return;  // not a JSON line: ordinary output
    }
    if (!j.is_object()) return;
    if (j.value("event", "") == "summary") {
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it.key() != "event") c.attrs[it.key()] = it.value();
      return;
    }
    for (const auto& o : cfg_.objectives)  // JSON has no NaN: null
      if (j.contains(o.metric) && (j[o.metric].is_number() || j[o.metric].is_null()))
        c.last[o.metric] = j[o.metric].is_null() ? NAN : j[o.metric].get<double>();
    const std::string& metric = cfg_.metric;
    if (!j.contains(metric) || !(j[metric].is_number() || j[metric].is_null())) return;
    const double v = j[metric].is_null() ? NAN : j[metric].get<double>();
    c.last_value = v, c.has_value = true;
    if (!j.contains("step") || c.pruned) return;
    report(c, j["step"], v, judge);
  }

  // Waits up to 200 ms for output from the running trials and handles every complete line.
  void read_output() {
    std::vector<pollfd> pfds;
    for (auto& [n, c] : running_) pfds.push_back({c.out_fd, POLLIN, 0});
    ::poll(pfds.data(), pfds.size(), 200);
    for (auto& [n, c] : running_) {
      char buf[4096];
      for (;;) {
        pollfd one{c.out_fd, POLLIN, 0};
        if (::poll(&one, 1, 0) <= 0 || !(one.revents & (POLLIN | POLLHUP))) break;
        const ssize_t k = ::read(c.out_fd, buf, sizeof buf);
        if (k <= 0) break;
        c.buf.append(buf, size_t(k));
      }
      size_t nl;
      while ((nl = c.buf.find('\n')) != std::string::npos) {
        const std::string line = c.buf.substr(0, nl);
        c.buf.erase(0, nl + 1);
        handle_line(c, line, /*judge=*/true);
      }
    }
  }

  // Stopped by a signal (scancel, preemption, Ctrl-C): the running trials are stopped and marked
  // stale at once, so another driver retries them now instead of after stale_after_s.
  // The reason of a trial its stopped driver gives back ("stale" is what retry_target retries;
  // "handed back" spares max_retry).
  std::string handed_back(int sig) const {
    return "stale: handed back by driver " + me_ + " (stopped by signal " + std::to_string(sig) +
           ")";
  }

  [[noreturn]] void hand_back(int sig) {
    for (auto& [n, c] : running_)
      if (c.pid > 0) ::kill(-c.pid, SIGTERM);
    for (auto& [n, c] : running_) {
      if (c.pid > 0) ::waitpid(c.pid, nullptr, 0);
      finish(c, "FAIL", NAN, handed_back(sig));
    }
    running_.clear();
    throw Interrupted(sig);
  }

  bool any_complete() {
    for (const auto& t : live_.update(journal_.read(), cfg_.space).trials)
      if (t.state == "COMPLETE") return true;
    return false;
  }

  // A trial that exits 2 rejected its configuration. When nothing has completed yet and the key
  // it names is not a sampled parameter, every trial would fail the same way (a typo in
  // trial.overrides, folds larger than the data): the study stops with that error (exit 2).
  void check_config_error(const Child& c) {
    if (any_complete()) return;
    std::ifstream in(c.log);
    std::string line, error, fix;
    while (std::getline(in, line)) {
      if (line.rfind("error: ", 0) == 0) error = line.substr(7);
      if (line.rfind("  fix: ", 0) == 0) fix = line.substr(7);
    }
    if (error.empty()) return;
    const std::string key = error.substr(0, error.find(':'));
    for (const auto& p : cfg_.space)
      if (p.name == key) return;  // a sampled value: this trial's problem only
    config_error_ = {"trial " + std::to_string(c.number) + " (log " + c.log.string() +
                         ") rejected its configuration: " + error +
                         "; every trial would fail the same way",
                     fix.empty() ? "fix trial.train / trial.overrides / objective" : fix};
  }

  // A trial that finished without reporting objective i: before any trial completed, the
  // objective names a metric the trials never report, and the study stops (exit 2).
  void missing_metric(const Child& c, size_t i) {
    if (any_complete()) return;
    std::string seen;
    for (const auto& [k, v] : c.attrs.items()) seen += (seen.empty() ? "" : ", ") + k;
    const std::string key =
        cfg_.multi() ? "objective.metrics[" + std::to_string(i) + "].metric" : "objective.metric";
    config_error_ = {key + ": trial " + std::to_string(c.number) + " exited 0 without reporting '" +
                         cfg_.objectives[i].metric + "' (its summary has: " +
                         (seen.empty() ? "nothing" : seen) + "; log " + c.log.string() + ")",
                     "name a metric the trial prints as a JSON field (`mltrain config metrics "
                     "CONFIG` lists a training config's)"};
  }

  // A trial killed by SIGTERM/SIGINT it was not sent by this driver, while the driver itself is
  // being stopped (scancel and Slurm's requeue signal every process of the job, the trial's
  // own group included): the driver's signal, awaited for up to 2 s since the two deliveries
  // race. Returns it, or 0 when the trial died on its own.
  int stopped_with_driver(int status) const {
    if (!WIFSIGNALED(status) || (WTERMSIG(status) != SIGTERM && WTERMSIG(status) != SIGINT))
      return 0;
    for (int i = 0; i < 40 && !stop_signal(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return stop_signal();
  }

  // The verdict on an exited trial from its exit status and what it reported.
  void judge_exit(Child& c, int status) {
    if (c.pruned) {
      finish(c, "PRUNED", c.has_value ? c.last_value : NAN,
             "pruned by " + cfg_.pruner.name + " at report " + std::to_string(c.values.size()));
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      for (size_t i = 0; i < cfg_.objectives.size(); ++i) {
        const std::string& m = cfg_.objectives[i].metric;
        if (!c.last.count(m)) {
          missing_metric(c, i);
          return finish(c, "FAIL", NAN,
                        "exited 0 without reporting '" + m +
                            "' on stdout (JSON lines); log: " + c.log.string());
        }
        if (!std::isfinite(c.last.at(m)))
          return finish(c, "FAIL", NAN, "diverged (" + m + " not finite)");
      }
      finish(c, "COMPLETE", c.last_value, "");
    } else if (const int sig = stopped_with_driver(status)) {
      finish(c, "FAIL", NAN, handed_back(sig));
    } else {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 2) check_config_error(c);
      std::string why = WIFSIGNALED(status)
                            ? "killed by signal " + std::to_string(WTERMSIG(status)) +
                                  (WTERMSIG(status) == SIGKILL ? " (out of memory?)" : "")
                            : "exit status " + std::to_string(WEXITSTATUS(status));
      const auto tail = last_line(c.log);
      if (!tail.empty()) why += ": " + tail;
      finish(c, "FAIL", NAN, why);
    }
  }

  void reap() {
    for (auto it = running_.begin(); it != running_.end();) {
      int status = 0;
      if (::waitpid(it->second.pid, &status, WNOHANG) != it->second.pid) {
        ++it;
        continue;
      }
      Child& c = it->second;
      // Drain what is left in the pipe (lines written just before exit).
      char buf[4096];
      ssize_t k;
      while ((k = ::read(c.out_fd, buf, sizeof buf)) > 0) c.buf.append(buf, size_t(k));
      std::istringstream rest(c.buf);
      std::string line;
      while (std::getline(rest, line))
        handle_line(c, line, /*judge=*/false);  // exited: nothing left to prune
      ::close(c.out_fd);
      c.attrs["duration_s"] = now_s() - c.started;
      judge_exit(c, status);
      it = running_.erase(it);
    }
  }

  nlohmann::json summary() {
    const auto trials = replay(journal_.read(), cfg_.space).trials;
    auto s = write_study_outputs(cfg_, trials);
    s["sampler_ms_per_trial_this_run"] = sampled_ ? 1000.0 * sampler_s_ / sampled_ : 0.0;
    s["sampler_ms_last_this_run"] = 1000.0 * last_sample_s_;  // the largest history's cost
    s["stopped_by"] = exhausted_ ? "grid exhausted"
                      : (cfg_.timeout_s() > 0 && now_s() - t0_ >= cfg_.timeout_s()) ? "timeout"
                                                                                    : "n_trials";
    write_file_atomic((cfg_.study_dir() / "summary.json").string(), s.dump(2) + "\n");
    return s;
  }

  const StudyConfig& cfg_;
  const RunStudyOptions& opt_;
  Journal journal_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Pruner> pruner_;
  const std::string me_;
  const TestFunction* fn_;
  const double sign_, t0_;
  double sampler_s_ = 0, last_sample_s_ = 0, last_beat_ = 0;
  int sampled_ = 0;
  bool exhausted_ = false, done_ = false;
  std::map<int, Child> running_;
  LiveReplay live_;                                   // the journal as the pruner sees it
  std::pair<std::string, std::string> config_error_;  // (error, fix): the study stops
};

}  // namespace

nlohmann::json run_study(const StudyConfig& cfg, const RunStudyOptions& opt) {
  install_stop_handlers();  // SIGTERM/SIGINT: hand the running trials back (Driver::hand_back)
  claim_study_folder(cfg);
  return Driver(cfg, opt).run();
}

}  // namespace mltrain::tune
