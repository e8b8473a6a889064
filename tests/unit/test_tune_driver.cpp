// The study driver: in-process and command trials, folds, failures, Pareto outputs, kills mid-study.
#include <catch2/catch.hpp>

#include "tune_support.hpp"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "mltrain/config/study.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/rng.hpp"
#include "mltrain/tune/analysis.hpp"
#include "mltrain/tune/functions.hpp"
#include "mltrain/tune/journal.hpp"
#include "mltrain/tune/pareto.hpp"
#include "mltrain/tune/pruner.hpp"
#include "mltrain/tune/sampler.hpp"
#include "mltrain/tune/study.hpp"

using namespace mltrain::tune;

static std::vector<int> running_at_each_create(const fs::path& journal) {
  std::ifstream in(journal);
  std::string line;
  std::set<int> running;
  std::vector<int> counts;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["op"] == "create") {
      counts.push_back(int(running.size()));
      running.insert(j["trial"].get<int>());
    } else if (j["op"] == "finish") {
      running.erase(j["trial"].get<int>());
    }
  }
  return counts;
}

TEST_CASE("tune driver: in-process functions run as on max_concurrent workers; curves are pruned",
          "[tune][driver]") {
  const auto d = tmpdir("concurrent");
  const std::string base =
      kBin + " tune " + MLTRAIN_SOURCE_DIR + "/configs/tune/branin.yaml -q study.dir=" + d.string();
  REQUIRE(sh(base + " objective.function=hartmann6 sampler.name=gp study.n_trials=12 "
                    "study.max_concurrent=4 study.name=gp4") == 0);
  const auto counts = running_at_each_create(d / "gp4" / "journal.jsonl");
  REQUIRE(counts.size() == 12);
  for (size_t i = 0; i < counts.size(); ++i) CHECK(counts[i] == std::min<int>(int(i), 3));
  // A learning-curve function: 27 reports per complete trial; the median pruner stops some early.
  REQUIRE(sh(base + " objective.function=curves_crossing sampler.name=tpe study.n_trials=30 "
                    "pruner.name=median study.name=curves") == 0);
  const auto cfg = study_config_from_folder((d / "curves").string());
  int pruned = 0, complete = 0;
  for (const auto& t : read_trials(d / "curves", cfg.space)) {
    if (t.state == "COMPLETE") {
      ++complete;
      CHECK(t.intermediate.size() == 27);
      CHECK(t.value == Approx(find_test_function("curves_crossing")->f(t.x)));
    } else {
      CHECK(t.state == "PRUNED");
      CHECK(t.intermediate.size() < 27);
      ++pruned;
    }
  }
  CHECK(complete + pruned == 30);
  CHECK(pruned > 0);
}

static bool all_gone(const fs::path& pids, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    bool alive = false;
    std::ifstream in(pids);
    for (pid_t pid; in >> pid && !alive;) {
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string comm_and_rest;
      if (!std::getline(stat, comm_and_rest)) continue;  // gone
      const size_t close = comm_and_rest.rfind(')');
      alive = close == std::string::npos || comm_and_rest.substr(close + 2, 1) != "Z";
    }
    if (!alive) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

static std::string trial_script(const fs::path& d, double sleep_s) {
  const auto p = d / "trial.sh";
  write(p,
        "#!/bin/sh\n"
        "x=$MLTRAIN_PARAM_X\n"
        "echo \"$MLTRAIN_TRIAL_NUMBER $x\" >> " +
            (d / "runs.log").string() + "\necho $$ >> " + (d / "pids.log").string() +
            "\n"
            "case \"$MLTRAIN_PARAM_MODE\" in crash) echo 'boom: out of cheese' >&2; exit 3;; nan) "
            "echo '{\"step\": 1, \"loss\": null}'; exit 0;; esac\n"
            "for s in 1 2 3; do sleep " +
            std::to_string(sleep_s) +
            "; "
            "awk -v x=\"$x\" -v s=$s 'BEGIN { printf \"{\\\"step\\\": %d, \\\"loss\\\": "
            "%.17g}\\n\", s, (x - 0.3) ^ 2 + 1 / s }'; done\n");
  fs::permissions(p, fs::perms::owner_all);
  return p.string();
}

// A random-sampler study of trial_script over x in [0, 1] (stale after 60 s); returns the command
// that runs (and, run again, resumes) it.

static std::string random_study(const fs::path& d, double sleep_s, const std::string& study) {
  const auto script = trial_script(d, sleep_s);
  write(d / "s.yaml", "study: {name: s, dir: " + d.string() + ", " + study +
                          ", stale_after_s: 60}\n"
                          "sampler: {name: random}\n"
                          "objective: {metric: loss, direction: minimize}\n"
                          "trial: {command: [" +
                          script +
                          "]}\n"
                          "space:\n  x: {type: float, low: 0, high: 1}\n");
  return kBin + " tune " + (d / "s.yaml").string() + " -q";
}

TEST_CASE("tune driver: command trials, failures recorded, outputs written", "[tune][driver]") {
  const auto d = tmpdir("driver");
  const auto script = trial_script(d, 0.0);
  write(d / "s.yaml", "study: {name: s, dir: " + d.string() +
                          ", n_trials: 8, seed: 1, max_concurrent: 2}\n"
                          "sampler: {name: tpe, n_startup: 3}\n"
                          "objective: {metric: loss, direction: minimize}\n"
                          "trial: {command: [" +
                          script +
                          "]}\n"
                          "space:\n  x: {type: float, low: 0, high: 1}\n  mode: {type: "
                          "categorical, choices: [ok, ok2, ok3, crash, nan]}\n");
  REQUIRE(sh(kBin + " tune " + (d / "s.yaml").string() + " -q --json > " +
             (d / "out.json").string()) == 0);
  std::ifstream in(d / "out.json");
  const auto s = nlohmann::json::parse(in);
  CHECK(s["trials"] == 8);
  const auto cfg = study_config_from_folder((d / "s").string());
  const auto trials = read_trials(d / "s", cfg.space);
  REQUIRE(trials.size() == 8);
  for (const auto& t : trials) {
    INFO("trial " << t.number << " " << t.params.dump() << " " << t.state << " " << t.reason);
    const std::string mode = t.params["mode"];
    if (mode == "crash") {
      CHECK(t.state == "FAIL");
      CHECK(t.reason.find("exit status 3: boom: out of cheese") != std::string::npos);
    } else if (mode == "nan") {
      CHECK(t.state == "FAIL");
      CHECK(t.reason.find("diverged") != std::string::npos);
    } else {
      CHECK(t.state == "COMPLETE");
      CHECK(t.intermediate.size() == 3);
      const double x = t.params["x"];
      CHECK(t.value == Approx((x - 0.3) * (x - 0.3) + 1.0 / 3).margin(1e-9));
    }
  }
  for (const char* f : {"trials.csv", "trials.jsonl", "best.yaml", "importance.json", "history.svg",
                        "importance.svg", "parallel.svg"})
    CHECK(fs::exists(d / "s" / f));
  // Bad study files: exit 2 naming the file, line and key.
  write(d / "bad.yaml",
        "study: {name: b, dir: " + d.string() +
            "}\nsampler: {name: tpe, n_candidtes: 3}\nspace:\n  x: {type: float, low: 1, high: 0}\n"
            "trial: {command: [/bin/true]}\n");
  REQUIRE(sh(kBin + " tune " + (d / "bad.yaml").string() + " 2> " + (d / "err.txt").string()) == 2);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  CHECK(err.find("bad.yaml:2:22: sampler.n_candidtes: unknown key") != std::string::npos);
  CHECK(err.find("space.x: low must be below high") != std::string::npos);
  CHECK(sh(kBin + " tune " + (d / "s.yaml").string() + " sampler.name=annealing 2>/dev/null") == 2);
}

TEST_CASE("tune driver: cross-validated trials run their folds as a group and report the mean",
          "[tune][driver][folds]") {
  const auto d = tmpdir("folds");
  // Fold i of a trial reports loss = (x - 0.3)^2 + 0.1 * i + 1 / s at steps 1..3.
  const auto p = d / "fold.sh";
  write(p,
        "#!/bin/sh\n"
        "echo \"$MLTRAIN_TRIAL_NUMBER $MLTRAIN_FOLD $MLTRAIN_FOLDS $MLTRAIN_FOLD_SEED\" >> " +
            (d / "folds.log").string() +
            "\nfor s in 1 2 3; do awk -v x=\"$MLTRAIN_PARAM_X\" -v f=$MLTRAIN_FOLD -v s=$s "
            "'BEGIN { printf \"{\\\"step\\\": %d, \\\"loss\\\": %.17g}\\n\", s, (x - 0.3) ^ 2 + "
            "0.1 * f + 1 / s "
            "}'; done\n");
  fs::permissions(p, fs::perms::owner_all);
  write(d / "s.yaml", "study: {name: s, dir: " + d.string() +
                          ", n_trials: 3, seed: 5}\n"
                          "sampler: {name: random}\n"
                          "objective: {metric: loss, direction: minimize, folds: 3}\n"
                          "trial: {command: [" +
                          p.string() + "]}\nspace:\n  x: {type: float, low: 0, high: 1}\n");
  REQUIRE(sh(kBin + " tune " + (d / "s.yaml").string() + " -q > /dev/null") == 0);
  const auto cfg = study_config_from_folder((d / "s").string());
  const auto trials = read_trials(d / "s", cfg.space);
  REQUIRE(trials.size() == 3);
  for (const auto& t : trials) {
    const double x = t.params["x"];
    INFO(t.number << " " << t.reason);
    REQUIRE(t.state == "COMPLETE");
    // Mean over folds 0, 1, 2 at the last step; reports are the running fold means.
    CHECK(t.value == Approx((x - 0.3) * (x - 0.3) + 0.1 + 1.0 / 3).margin(1e-12));
    REQUIRE(t.intermediate.size() == 3);
    CHECK(t.intermediate[0].second == Approx((x - 0.3) * (x - 0.3) + 0.1 + 1.0).margin(1e-12));
    CHECK(t.attrs["loss_std"].get<double>() == Approx(0.1).margin(1e-12));  // sd of 0, .1, .2
    CHECK(t.attrs["folds"]["loss"].size() == 3);
  }
  // Every fold of every trial ran once, with the study's seed.
  std::ifstream in(d / "folds.log");
  std::multiset<std::string> runs;
  for (std::string line; std::getline(in, line);) runs.insert(line);
  CHECK(runs.size() == 9);
  for (int t = 0; t < 3; ++t)
    for (int f = 0; f < 3; ++f)
      CHECK(runs.count(std::to_string(t) + " " + std::to_string(f) + " 3 5") == 1);
  std::ifstream b(d / "s" / "best.yaml");
  const std::string best((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
  CHECK(best.find("# folds (3): loss [") != std::string::npos);
}

TEST_CASE("tune: folds larger than the data stop the study with exit 2 naming data.folds",
          "[tune][driver][folds]") {
  const auto d = tmpdir("folds_bad");
  // From the source folder: the study's trial.train is a path relative to it.
  const std::string cmd = "cd " + std::string(MLTRAIN_SOURCE_DIR) + " && " + kBin +
                          " tune configs/tune/fashion_mnist_mlp.yaml -q study.dir=" + d.string() +
                          " study.n_trials=3 objective.folds=10 pruner.name=none "
                          "'trial.overrides=[data.limit_train=5]' "
                          "2> " +
                          (d / "err.txt").string();
  CHECK(sh(cmd) == 2);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  INFO(err);
  CHECK(err.find("data.folds: 10 folds of 5 training samples leave a fold empty") !=
        std::string::npos);
  CHECK(err.find("fix: use at most 5 folds") != std::string::npos);
  // A test function has no data: refused when the study file is read.
  CHECK(sh(kBin + " tune " + MLTRAIN_SOURCE_DIR +
           "/configs/tune/branin.yaml objective.folds=3 -q "
           "study.dir=" +
           d.string() + " 2> " + (d / "err2.txt").string()) == 2);
  std::ifstream e2(d / "err2.txt");
  const std::string err2((std::istreambuf_iterator<char>(e2)), std::istreambuf_iterator<char>());
  CHECK(err2.find("objective.folds") != std::string::npos);
}

TEST_CASE(
    "several objectives: Pareto front outputs, pruning spares the front, a metric never "
    "reported stops the study",
    "[tune][driver][pareto]") {
  const auto d = tmpdir("pareto");
  const std::string base =
      kBin + " tune " + MLTRAIN_SOURCE_DIR + "/configs/tune/branin.yaml -q study.dir=" + d.string();
  REQUIRE(sh(base + " objective.function=zdt1 study.n_trials=40 study.name=z > /dev/null") == 0);
  std::ifstream pj(d / "z" / "pareto.json");
  const auto front = nlohmann::json::parse(pj);
  REQUIRE(front["front"].size() >= 2);
  const auto cfg = study_config_from_folder((d / "z").string());
  const auto trials = read_trials(d / "z", cfg.space);
  for (const auto& f : front["front"]) {  // nobody dominates a front member; values are ZDT1's
    const auto x = trials[f["number"].get<size_t>()].x;
    const std::vector<double> v = f["values"];
    CHECK(v == find_test_function("zdt1")->fm(x));
    for (const auto& t : trials) CHECK_FALSE(dominates(t.values, v));
  }
  CHECK(front["hypervolume"].get<double>() > 0);
  CHECK(fs::exists(d / "z" / "pareto.svg"));
  std::ifstream csv(d / "z" / "trials.csv");
  std::string header;
  std::getline(csv, header);
  CHECK(header.rfind("number,state,value,f1,f2,x1", 0) == 0);

  // loss falls with x, size grows with x: every "good" trial is on the front of (loss, size) and
  // is never pruned, though the median pruner on loss alone stops some; "bad" ones are dominated.
  const auto p = d / "two.sh";
  write(p,
        "#!/bin/sh\nb=0; [ \"$MLTRAIN_PARAM_MODE\" = bad ] && b=5\n"
        "for s in 1 2 3 4 5; do awk -v x=\"$MLTRAIN_PARAM_X\" -v s=$s -v b=$b 'BEGIN { printf "
        "\"{\\\"step\\\": %d, \\\"loss\\\": %.17g, \\\"size\\\": %.17g}\\n\", s, 1 - x + b + 1 / "
        "s, x + b "
        "}'; done\n");
  fs::permissions(p, fs::perms::owner_all);
  auto study = [&](const std::string& name, const std::string& objective) {
    write(d / (name + ".yaml"), "study: {name: " + name + ", dir: " + d.string() +
                                    ", n_trials: 16, seed: 3}\nsampler: {name: random}\n"
                                    "pruner: {name: median, n_startup_trials: 2}\nobjective: " +
                                    objective + "\ntrial: {command: [" + p.string() +
                                    "]}\nspace:\n  x: {type: float, low: 0, high: 1}\n"
                                    "  mode: {type: categorical, choices: [good, good2, bad]}\n");
    REQUIRE(sh(kBin + " tune " + (d / (name + ".yaml")).string() + " -q > /dev/null") == 0);
    const auto c = study_config_from_folder((d / name).string());
    return read_trials(d / name, c.space);
  };
  int pruned_good = 0, pruned_bad = 0;
  for (const auto& t : study("single", "{metric: loss, direction: minimize}"))
    if (t.state == "PRUNED" && t.params["mode"] != "bad") ++pruned_good;
  CHECK(pruned_good > 0);  // loss alone: good trials with small x are pruned
  pruned_good = 0;
  for (const auto& t : study("both",
                             "[{metric: loss, direction: minimize}, {metric: size, "
                             "direction: minimize}]")) {
    INFO("trial " << t.number << " " << t.params.dump() << " " << t.state);
    if (t.params["mode"] == "bad") {
      pruned_bad += t.state == "PRUNED";
    } else {
      CHECK(t.state == "COMPLETE");
      CHECK(t.values.size() == 2);
    }
  }
  CHECK(pruned_bad > 0);  // dominated trials are still pruned

  // An objective the trials never report: exit 2 naming the key.
  write(d / "missing.yaml", "study: {name: m, dir: " + d.string() +
                                ", n_trials: 3}\nsampler: {name: random}\n"
                                "objective: [{metric: loss, direction: minimize}, {metric: "
                                "latency_ms, direction: minimize}]\ntrial: {command: [" +
                                p.string() + "]}\nspace:\n  x: {type: float, low: 0, high: 1}\n");
  CHECK(sh(kBin + " tune " + (d / "missing.yaml").string() + " -q 2> " +
           (d / "err.txt").string()) == 2);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  CHECK(err.find("objective.metrics[1].metric") != std::string::npos);
  CHECK(err.find("latency_ms") != std::string::npos);
  // GP optimises one objective: refused at config time.
  CHECK(sh(kBin + " tune " + (d / "missing.yaml").string() + " sampler.name=gp -q 2>/dev/null") ==
        2);
}

TEST_CASE("tune driver: SIGKILL mid-study, rerun completes with no trial lost or run twice",
          "[tune][driver]") {
  const auto d = tmpdir("resume");
  const std::string cmd = random_study(d, 0.3, "n_trials: 6, seed: 2, max_concurrent: 2");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd + " >/dev/null 2>&1").c_str(), nullptr);
    ::_exit(127);
  }
  // Kill the driver once two trials have finished and others are running.
  const auto journal = d / "s" / "journal.jsonl";
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream j(journal);
    std::string all((std::istreambuf_iterator<char>(j)), std::istreambuf_iterator<char>());
    size_t n = 0, at = 0;
    while ((at = all.find("\"op\":\"finish\"", at)) != std::string::npos) ++n, ++at;
    if (n >= 2) break;
  }
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  {
    std::ifstream pids(d / "pids.log");
    int started = 0;
    for (pid_t p; pids >> p;) ++started;
    REQUIRE(started >= 2);  // the two that finished before the driver was killed, at least
  }
  REQUIRE(all_gone(d / "pids.log", 30));  // the trials die with their driver (PDEATHSIG)
  auto before = read_trials(d / "s", study_config_from_folder((d / "s").string()).space);
  int complete_before = 0, running_before = 0;
  for (const auto& t : before)
    complete_before += t.state == "COMPLETE", running_before += t.state == "RUNNING";
  REQUIRE(complete_before >= 2);
  REQUIRE(complete_before < 6);
  REQUIRE(sh(cmd + " > /dev/null 2>&1") == 0);  // the same command resumes
  const auto after = read_trials(d / "s", study_config_from_folder((d / "s").string()).space);
  int complete = 0, stale = 0;
  std::map<std::string, int> x_complete;
  for (const auto& t : after) {
    if (t.state == "COMPLETE") ++complete, x_complete[t.params["x"].dump()]++;
    if (t.state == "FAIL") {
      CHECK(t.reason.rfind("stale", 0) == 0);
      ++stale;
    }
  }
  CHECK(complete == 6);            // n_trials reached: nothing lost
  CHECK(stale == running_before);  // each interrupted trial failed as stale ...
  for (const auto& t : after)
    if (t.state == "FAIL") {  // ... and was retried with the same parameters
      bool retried = false;
      for (const auto& u : after)
        retried |= u.retry_of == t.number && u.params == t.params && u.state == "COMPLETE";
      CHECK(retried);
    }
  for (const auto& [x, n] : x_complete) CHECK(n == 1);  // no finished trial run again
  // Every trial process that started: the completed ones before the kill ran exactly once.
  std::ifstream runs(d / "runs.log");
  std::map<int, int> started;
  int num;
  std::string x;
  while (runs >> num >> x) started[num]++;
  for (const auto& t : before)
    if (t.state == "COMPLETE") CHECK(started[t.number] == 1);
  CHECK(int(after.size()) == 6 + stale);
}

TEST_CASE("tune driver: killed inside a journal append (MLTRAIN_FAULT), rerun loses nothing",
          "[tune][driver][fault]") {
  // journal.write: half of an append's bytes reach the file (a torn line); journal.fsync: all of
  // them, not yet synced. The k-th append is the one killed, mid-study, each k a different record.
  for (const std::string point : {"journal.write@5", "journal.write@9", "journal.fsync@6"}) {
    DYNAMIC_SECTION(point) {
      const auto d = tmpdir("journal_fault");
      const std::string cmd = random_study(d, 0.0, "n_trials: 5, seed: 3, max_concurrent: 1");
      REQUIRE(sh("MLTRAIN_FAULT=" + point + " " + cmd + " > " + (d / "killed.log").string() +
                 " 2>&1") == 128 + SIGKILL);
      std::ifstream log(d / "killed.log");
      const std::string out((std::istreambuf_iterator<char>(log)),
                            std::istreambuf_iterator<char>());
      CHECK(out.find("[fault] killed at " + point) != std::string::npos);
      REQUIRE(all_gone(d / "pids.log", 30));
      const auto space = study_config_from_folder((d / "s").string()).space;
      const auto before = read_trials(d / "s", space);
      REQUIRE(sh(cmd + " > /dev/null 2>&1") == 0);  // the same command resumes
      const auto after = read_trials(d / "s", space);
      int complete = 0;
      std::map<std::string, int> x_complete;
      for (const auto& t : after) {
        CHECK(t.number >= 0);  // every trial number was created (once: replay keeps one state)
        if (t.state == "COMPLETE") ++complete, x_complete[t.params["x"].dump()]++;
        if (t.state == "FAIL") CHECK(t.reason.rfind("stale", 0) == 0);
      }
      CHECK(complete == 5);
      for (const auto& [x, n] : x_complete) CHECK(n == 1);
      for (const auto& t : before)  // what was complete before the kill is kept, not rerun
        if (t.state == "COMPLETE") CHECK(after[size_t(t.number)].state == "COMPLETE");
      // The journal holds whole records only, but for the torn one, which readers skip.
      std::ifstream j(d / "s" / "journal.jsonl");
      int torn = 0;
      for (std::string line; std::getline(j, line);) torn += !nlohmann::json::accept(line);
      CHECK(torn == (point.rfind("journal.write", 0) == 0 ? 1 : 0));
    }
  }
}

// ---------------------------------------------------------------- study files on the schema

TEST_CASE(
    "importance and Spearman sensitivity on a synthetic study: the parameter that decides the "
    "objective ranks first, a small one second, an irrelevant one last near zero",
    "[tune][importance]") {
  // f = 10 a + b (c unused), minimised, over 400 uniform random trials: the best fifth is set by a
  // alone, b barely shifts it, c not at all. Spearman's rho of f with a is about
  // 10 / sqrt(101) = 0.995, with b about 1 / sqrt(101) = 0.10, with c 0 (standard error 0.05).
  const Space space = {Param::floating("a", 0, 1), Param::floating("b", 0, 1),
                       Param::floating("c", 0, 1)};
  mltrain::SplitMix rng{20261205};
  std::vector<TrialState> trials;
  for (int i = 0; i < 400; ++i) {
    TrialState t;
    t.number = i;
    t.state = "COMPLETE";
    t.x = {rng.uniform(), rng.uniform(), rng.uniform()};
    t.value = 10 * t.x[0] + t.x[1];
    trials.push_back(t);
  }
  const auto imp = parameter_importance(space, trials, /*maximize=*/false);
  REQUIRE(imp.size() == 3);
  std::map<std::string, std::pair<double, double>> by;  // param -> (importance, spearman)
  for (const auto& r : imp) by[r["param"]] = {r["importance"], r["spearman"]};
  CHECK(imp[0]["param"] == "a");
  CHECK(imp[1]["param"] == "b");
  CHECK(imp[2]["param"] == "c");
  CHECK(by["a"].first > 0.6);
  CHECK(by["c"].first < 0.2);
  CHECK(by["a"].first + by["b"].first + by["c"].first == Approx(1.0));
  CHECK(by["a"].second == Approx(0.995).margin(0.01));
  CHECK(by["b"].second == Approx(0.10).margin(0.1));
  CHECK(std::abs(by["c"].second) < 0.15);
  // Maximising the same values reverses which trials are best but not the ranking of causes.
  const auto up = parameter_importance(space, trials, /*maximize=*/true);
  CHECK(up[0]["param"] == "a");
  CHECK(up[2]["param"] == "c");
}
