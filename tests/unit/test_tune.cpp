// The tuner's journal, pruners, Pareto fronts and study files.
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
#include "mltrain/tune/analysis.hpp"
#include "mltrain/tune/functions.hpp"
#include "mltrain/tune/journal.hpp"
#include "mltrain/tune/pareto.hpp"
#include "mltrain/tune/pruner.hpp"
#include "mltrain/tune/sampler.hpp"
#include "mltrain/tune/study.hpp"

using namespace mltrain::tune;

TEST_CASE(
    "journal: incremental reads skip a torn line, see other writers, start over after a truncation",
    "[tune]") {
  const fs::path dir = fs::temp_directory_path() / "mltrain_test_journal";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path p = dir / "journal.jsonl";
  using J = nlohmann::json;
  Journal a(p), b(p);  // two drivers on one study
  a.append({J{{"n", 1}}, J{{"n", 2}}});
  REQUIRE(a.read().size() == 2);
  { std::ofstream(p, std::ios::app) << R"({"n": 3, "torn)"; }  // a writer killed mid-line
  CHECK(a.read().size() == 2);                                 // no newline yet: not a record
  CHECK(b.read().size() == 2);
  b.append({J{{"n", 4}}});  // terminates the torn line first
  const auto& seen = a.read();
  REQUIRE(seen.size() == 3);
  CHECK(seen.back()["n"] == 4);
  size_t in_transaction = 0;
  a.transact([&](const std::vector<J>& recs) {
    in_transaction = recs.size();
    return std::vector<J>{J{{"n", 5}}};
  });
  CHECK(in_transaction == 3);
  CHECK(b.read().size() == 4);
  // The file as a fresh reader sees it: the same records, the torn line dropped.
  Journal c(p);
  CHECK(c.read() == b.read());
  // Replaced by hand with a shorter file: readers start over instead of reading past its end.
  {
    std::ofstream(p, std::ios::trunc) << R"({"n": 9})"
                                      << "\n";
  }
  REQUIRE(a.read().size() == 1);
  CHECK(a.read()[0]["n"] == 9);
  fs::remove_all(dir);
}

TEST_CASE("pruners: accept/reject tables", "[tune]") {
  // Values are minimised. Four complete trials; D starts slowest and ends best (crossing curves).
  std::vector<TrialCurve> done = {{0, true, true, {1.0, 0.8, 0.6}},
                                  {1, true, true, {2.0, 1.5, 1.2}},
                                  {2, true, true, {3.0, 2.0, 1.8}},
                                  {3, true, true, {4.0, 1.0, 0.3}}};
  PrunerOptions o;
  o.name = "median";
  o.n_startup_trials = 4;
  auto med = make_pruner(o);
  // The good finishers: final value within the 25th percentile of finals (half the median's 50),
  // at least two: [0.3, 0.6, 1.2, 1.8] -> 0.525, D alone, so D and A. A trial is pruned when its
  // best so far is worse than every good finisher was at the same report (three reports are too
  // few to measure the noise: no margin).
  CHECK_FALSE(med->should_prune({9, false, false, {3.5}}, done));  // <= D's 4.0 (Optuna: > 2.5)
  CHECK(med->should_prune({9, false, false, {3.5, 1.2}}, done));   // best 1.2 > D's 1.0, A's 0.8
  CHECK_FALSE(med->should_prune({9, false, false, {3.5, 0.9}}, done));
  CHECK_FALSE(med->should_prune({9, false, false, {3.5, 1.0}}, done));        // equal is kept
  CHECK_FALSE(med->should_prune({9, false, false, {3.5, 1.0, 0.55}}, done));  // <= A's 0.6
  CHECK(med->should_prune({9, false, false, {3.5, 1.0, 0.65}}, done));
  CHECK(med->should_prune({9, false, false, {NAN}}, done));  // a NaN curve never recovers
  // Pruned trials do not form the reference: only complete ones do (as in Optuna).
  auto with_pruned = done;
  with_pruned.push_back({4, true, false, {0.1, 0.1}});
  CHECK(med->should_prune({9, false, false, {3.5, 1.2}}, with_pruned));
  o.n_startup_trials = 5;
  CHECK_FALSE(make_pruner(o)->should_prune({9, false, false, {3.5, 1.2}},
                                           with_pruned));  // 4 complete trials: not enough yet
  // The noise margin: half the median residual sd of the complete trials' latter halves around a
  // quadratic. E and F: +-0.1 alternating (E on a linear trend), sd 0.135224680756 each (numpy
  // polyfit, degree 2, ddof 3); G is smooth (0). Good finishers F (0.4) and E (0.45); margin
  // 0.0676.
  std::vector<TrialCurve> noisy(3);
  for (int t = 0; t < 10; ++t) {
    const double alt = t % 2 == 0 ? 0.1 : -0.1;
    noisy[0].values.push_back(1.0 + alt - 0.05 * t);
    noisy[1].values.push_back(0.5 + alt);
    noisy[2].values.push_back(2.0);
  }
  for (int i = 0; i < 3; ++i) noisy[size_t(i)].number = i, noisy[size_t(i)].complete = true;
  o.n_startup_trials = 3;
  auto noisy_med = make_pruner(o);
  CHECK_FALSE(noisy_med->should_prune({9, false, false, {1.16}}, noisy));  // E's 1.1 + 0.0676
  CHECK(noisy_med->should_prune({9, false, false, {1.17}}, noisy));
  CHECK_FALSE(noisy_med->should_prune({9, false, false, {2.0, 0.9}}, noisy));  // E's 0.85 + margin
  CHECK(noisy_med->should_prune({9, false, false, {2.0, 0.95}}, noisy));
  // A long curve (2001 reports, a steep quadratic trend): the fit stays well conditioned. numpy:
  // the latter half's residual sd is 0.10014988796753764, so the margin 0.0500749.
  std::vector<TrialCurve> long_curves(3);
  for (int i = 0; i < 3; ++i) {
    long_curves[size_t(i)].number = i, long_curves[size_t(i)].complete = true;
    for (int t = 0; t <= 2000; ++t)
      long_curves[size_t(i)].values.push_back(5.0 - 4e-3 * t + 1e-6 * t * t +
                                              (t % 2 == 0 ? 0.1 : -0.1));
  }
  CHECK_FALSE(noisy_med->should_prune({9, false, false, {5.1500}}, long_curves));  // 5.1 + 0.05007
  CHECK(noisy_med->should_prune({9, false, false, {5.1502}}, long_curves));
  // ASHA, eta 3, min_resource 1: rungs at 1, 3, 9 reports past the first (reports 2, 4, 10).
  o = PrunerOptions();
  o.name = "asha", o.reduction_factor = 3, o.min_resource = 1;
  auto asha = make_pruner(o);
  std::vector<TrialCurve> seen;
  for (int i = 0; i < 6; ++i)
    seen.push_back({i, true, true, {double(i), double(i), double(i), double(i)}});
  CHECK_FALSE(asha->should_prune({9, false, false, {9.0}}, seen));            // report 1: no rung
  CHECK_FALSE(asha->should_prune({9, false, false, {9.0, 0.5}}, seen));       // top 7/3 = 2: 2nd
  CHECK(asha->should_prune({9, false, false, {9.0, 1.5}}, seen));             // 3rd of 7: pruned
  CHECK_FALSE(asha->should_prune({9, false, false, {0.5, 0.5, 9.0}}, seen));  // report 3: no rung
  CHECK(asha->should_prune({9, false, false, {0.5, 0.5, 9.0, 9.0}}, seen));   // rung 4: worst
  CHECK_FALSE(asha->should_prune({9, false, false, {0.5, 0.5}}, {}));  // alone at a rung: promoted
  CHECK(asha->should_prune({9, false, false, {0.5, NAN}}, seen));      // diverged
  // Hyperband: several brackets, the cheapest (most aggressive) taking the most trials.
  o.name = "hyperband", o.max_resource = 9;
  std::map<int, int> per;
  for (int n = 0; n < 300; ++n) per[hyperband_bracket(o, n)]++;
  CHECK(per.size() == 3);
  CHECK(per[0] > per[1]);
  CHECK(per[1] > per[2]);
}

// A trial script: reports `steps` intermediate values of a quadratic in x (lower is better),
// marks each run in runs.log, can crash or diverge on request.
// True once every process listed in `pids` (one per line) has exited: no such process, or a
// zombie nobody has reaped yet. Polls for at most `seconds`.

TEST_CASE("Pareto fronts: dominance, non-dominated ranks, hypervolume by hand", "[tune][pareto]") {
  CHECK(dominates({1, 2}, {2, 2}));
  CHECK_FALSE(dominates({1, 2}, {1, 2}));  // equal: neither dominates
  CHECK_FALSE(dominates({1, 3}, {2, 2}));
  CHECK(nondominated_ranks({{1, 4}, {2, 2}, {4, 1}, {3, 3}, {4, 4}}) ==
        std::vector<int>{0, 0, 0, 1, 2});
  // Staircase below (4, 4): 3 x 1 + 2 x 1 + 1 x 1 = 6; a point outside the reference adds nothing.
  CHECK(hypervolume({{1, 3}, {2, 2}, {3, 1}, {5, 0}}, {4, 4}) == Approx(6));
  CHECK(hypervolume({{1, 1, 1}}, {2, 2, 2}) == Approx(1));
  // Two boxes of 4 and 2 sharing a unit cube: 5.
  CHECK(hypervolume({{0, 0, 1}, {1, 1, 0}}, {2, 2, 2}) == Approx(5));
  // The good group's boundary front by hypervolume contribution: the knee first.
  CHECK(select_best({{0, 3}, {1, 1}, {3, 0}, {4, 4}}, 1) == std::vector<size_t>{1});
  CHECK(select_best({{0, 3}, {1, 1}, {3, 0}, {4, 4}}, 4).back() == 3);  // the dominated one last
}

TEST_CASE("journal replay: hostile records are skipped, never fatal or huge", "[tune][journal]") {
  // Found by tests/fuzz/fuzz_journal.cpp: a create without params threw out_of_range past the
  // driver; a trial number of 2e9 resized the trial table to 2e9 entries.
  const auto d = tmpdir("hostile_journal");
  fs::create_directories(d / "s");
  write(d / "s" / "journal.jsonl",
        "{\"op\":\"create\",\"trial\":0,\"params\":{\"x\":0.5},\"worker\":\"w\"}\n"
        "{\"op\":\"create\",\"trial\":1}\n"                                   // no params
        "{\"op\":\"create\",\"trial\":2000000000,\"params\":{}}\n"            // past any journal
        "{\"op\":\"create\",\"trial\":\"2\",\"params\":{}}\n"                 // a string number
        "{\"op\":\"report\",\"trial\":0,\"step\":1e300,\"value\":1}\n"        // a float step
        "[1, 2, 3]\n\"text\"\n17\n"                                           // not objects
        "{\"op\":\"create\",\"trial\":1,\"params\":{},\"retry_of\":1e300}\n"  // float
        "{\"op\":\"finish\",\"trial\":0,\"state\":7}\n"  // a state of the wrong type
        "{\"op\":\"finish\",\"trial\":0,\"state\":\"COMPLETE\",\"value\":0.25}\n");
  const Space space = {Param::floating("x", 0, 1)};
  std::vector<TrialState> trials;
  REQUIRE_NOTHROW(trials = read_trials(d / "s", space));
  REQUIRE(trials.size() == 1);
  CHECK(trials[0].state == "COMPLETE");
  CHECK(trials[0].value == 0.25);
  REQUIRE(trials[0].intermediate.size() == 1);
  CHECK(trials[0].intermediate[0].first == 0);  // the float step counted as the next one
  // A line another driver (or program) wrote that is not JSON at all: the study resumes over it,
  // with a warning naming the journal and the offset.
  const std::string run =
      kBin + " tune " + MLTRAIN_SOURCE_DIR +
      "/configs/tune/branin.yaml -q study.n_trials=4 study.name=g study.dir=" + d.string();
  REQUIRE(sh(run + " study.n_trials=2 > /dev/null 2>&1") == 0);
  { std::ofstream(d / "g" / "journal.jsonl", std::ios::app) << "garbage {from another driver\n"; }
  REQUIRE(sh(run + " > /dev/null 2> " + (d / "err.txt").string()) == 0);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  CHECK(err.find("journal.jsonl offset ") != std::string::npos);
  CHECK(err.find("skipped a line that is not a JSON record (garbage {from another driver)") !=
        std::string::npos);
  CHECK(read_trials(d / "g", find_test_function("branin")->space).size() == 4);
}

TEST_CASE("journal format: a new journal names its writer; another format exits 3 naming it",
          "[tune][journal]") {
  const auto d = tmpdir("journal_format");
  const std::string run = kBin + " tune " + MLTRAIN_SOURCE_DIR +
                          "/configs/tune/branin.yaml -q study.n_trials=3 study.dir=" + d.string();
  REQUIRE(sh(run + " study.name=new > /dev/null 2>&1") == 0);
  std::string first;
  std::getline(std::ifstream(d / "new" / "journal.jsonl") >> std::ws, first);
  const auto h = nlohmann::json::parse(first);
  CHECK(h.at("op") == "journal");
  CHECK(h.at("format") == kJournalFormat);
  CHECK(h.at("mltrain").get<std::string>().find('.') != std::string::npos);
  // Resuming it (same format) works and keeps one header.
  REQUIRE(sh(run + " study.n_trials=5 study.name=new > /dev/null 2>&1") == 0);
  CHECK(read_trials(d / "new", find_test_function("branin")->space).size() == 5);
  // A journal a newer mltrain wrote in another format: resume, report and export refuse it with
  // exit 3, naming the version and the journal, and the journal is left as it was.
  fs::create_directories(d / "newer");
  const std::string newer =
      "{\"op\":\"journal\",\"format\":2,\"mltrain\":\"9.4.0\"}\n"
      "{\"op\":\"create\",\"trial\":0,\"params\":{\"x1\":1,\"x2\":2},\"worker\":\"w\"}\n";
  write(d / "newer" / "journal.jsonl", newer);
  fs::copy_file(d / "new" / "study.yaml", d / "newer" / "study.yaml");
  for (const std::string& cmd :
       {run + " study.name=newer", kBin + " tune report " + (d / "newer").string(),
        kBin + " tune export " + (d / "newer").string() + " --optuna-journal " +
            (d / "o.log").string()}) {
    INFO(cmd);
    CHECK(sh(cmd + " > /dev/null 2> " + (d / "err.txt").string()) == 3);
    std::ifstream e(d / "err.txt");
    const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
    CHECK(err.find("newer/journal.jsonl: written by mltrain 9.4.0 in journal format 2") !=
          std::string::npos);
    CHECK(err.find("fix: resume or report the study with mltrain 9.4.0") != std::string::npos);
  }
  std::ifstream j(d / "newer" / "journal.jsonl");
  CHECK(std::string((std::istreambuf_iterator<char>(j)), std::istreambuf_iterator<char>()) ==
        newer);
  // A first record whose "op" is not a string is no header (found by fuzz_journal: it threw).
  fs::create_directories(d / "odd");
  write(d / "odd" / "journal.jsonl", "{\"op\":33367092749}\n{\"op\":\"journal\",\"format\":[]}\n");
  CHECK_NOTHROW(read_trials(d / "odd", find_test_function("branin")->space));
  // A header whose format is not a number: refused (exit 3), naming what it holds.
  write(d / "odd" / "journal.jsonl", "{\"op\":\"journal\",\"format\":[],\"mltrain\":7}\n");
  CHECK_THROWS_WITH(read_trials(d / "odd", find_test_function("branin")->space),
                    Catch::Contains("written by mltrain unknown in journal format []"));
  // A journal from before the header (format 1 without it) still resumes.
  fs::create_directories(d / "old");
  std::ifstream src(d / "new" / "journal.jsonl");
  std::string body, line;
  std::getline(src, line);  // drop the header
  while (std::getline(src, line)) body += line + "\n";
  write(d / "old" / "journal.jsonl", body);
  fs::copy_file(d / "new" / "study.yaml", d / "old" / "study.yaml");
  REQUIRE(sh(run + " study.n_trials=6 study.name=old > /dev/null 2>&1") == 0);
  CHECK(read_trials(d / "old", find_test_function("branin")->space).size() == 6);
}

TEST_CASE("study files: accept/reject table, every problem with file:line:col",
          "[tune][study_file]") {
  const auto d = tmpdir("study_table");
  const std::string ok_trial = "trial: {command: [/bin/true]}\n";
  const std::string ok_space = "space:\n  x: {type: float, low: 0, high: 1}\n";
  struct Row {
    std::string yaml;
    std::vector<std::string> overrides;
    std::vector<std::string> expect;  // empty: accepted; else substrings of the one ConfigError
  };
  const std::vector<Row> rows = {
      {ok_trial + ok_space, {}, {}},
      {"objective: {function: branin}\n", {}, {}},
      {"study: {timeout: 30m}\n" + ok_trial + ok_space, {}, {}},
      {"smapler: {name: tpe}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:1: smapler: unknown key (did you mean 'sampler'?)"}},
      {"study: {n_trails: 3}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:9: study.n_trails: unknown key (did you mean 'n_trials'?)"}},
      {ok_trial + ok_space,
       {"sampler.name=annealing"},
       {"override 'sampler.name=annealing': sampler.name: 'annealing' is not one of: grid, random, "
        "tpe, gp"}},
      {"study: {timeout: 600}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:18: study.timeout: '600' has no unit: write 600s"}},
      {"study: {timeout: 2ep}\n" + ok_trial + ok_space,
       {},
       {"study.timeout: unknown unit 'ep' in '2ep' (a duration takes s, m or h)"}},
      {"study: {n_trials: 0}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:19: study.n_trials: must be > 0"}},
      {ok_trial + "space:\n  x: {type: float, low: 1, high: 0}\n",
       {},
       {"s.yaml:3:3: space.x: low must be below high (1 >= 0)"}},
      {ok_trial + "space:\n  x: {type: float, low: 0, high: 1, log: true}\n",
       {},
       {"s.yaml:3:25: space.x.low: a log-scaled parameter needs low > 0"}},
      {ok_trial + "space:\n  c: {type: categorical, choices: []}\n",
       {},
       {"space.c.choices: a categorical parameter needs a non-empty list of choices"}},
      {ok_trial + "space:\n  x: {low: 0, high: 1}\n",
       {},
       {"s.yaml:3:3: space.x: missing type; use float, int or categorical"}},
      {ok_trial + "space:\n  x: {type: double, low: 0, high: 1}\n",
       {},
       {"s.yaml:3:13: space.x.type: 'double' is not one of: float, int, categorical"}},
      {ok_trial + "space:\n  n: {type: int, low: 0.5, high: 4}\n",
       {},
       {"space.n: an int parameter needs integer low and high"}},
      {ok_trial + "space:\n  x: {type: float, low: 0, high: 1, grid: [0.5, 2]}\n",
       {},
       {"space.x.grid: value 2 is outside [low, high]"}},
      {"trial: {command: [/bin/true]}\nobjective: {function: branin}\n",
       {},
       {"trial: choose one of trial.train, trial.command and objective.function"}},
      {ok_space, {}, {"objective: nothing to tune"}},
      {"trial: {train: nope.yaml}\n" + ok_space,
       {},
       {"s.yaml:1:16: trial.train: 'nope.yaml' does not exist"}},
      {"objective: {function: bananas}\n",
       {},
       {"s.yaml:1:23: objective.function: unknown test function 'bananas' (have: "}},
      {"sampler: {name: grid}\n" + ok_trial + ok_space,
       {},
       {"sampler.name: the grid sampler needs `grid: [...]` or a `step`"}},
      {ok_trial + ok_space,
       {"sampler.n_candidtes=3"},
       {"sampler.n_candidtes: unknown key (did you mean 'sampler.n_candidates'?)"}},
      {"study: {seed: 1, seed: 2}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:18: study.seed: duplicate key (first set at line 1)"}},
      {"sampler: {gamma: 1.5}\n" + ok_trial + ok_space, {}, {"sampler.gamma: must be in (0, 1)"}},
      {ok_trial + "space: [x, y]\n",
       {},
       {"s.yaml:2:8: space: expected a mapping of names to settings"}},
      {"study: {name: a/b, max_retry: -1}\n" + ok_trial + ok_space,
       {},
       {"study.name: must be a non-empty name without '/'", "study.max_retry: must be >= 0",
        "2 config errors"}},
  };
  REQUIRE(rows.size() >= 15);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const auto path = d / "s.yaml";
    write(path, r.yaml);
    INFO("row " << i << ":\n" << r.yaml);
    if (r.expect.empty()) {
      CHECK_NOTHROW(load_study_config(path.string(), r.overrides));
      continue;
    }
    try {
      load_study_config(path.string(), r.overrides);
      FAIL("accepted");
    } catch (const mltrain::ConfigError& e) {
      const std::string what = e.what();
      INFO(what);
      for (const auto& s : r.expect) CHECK(what.find(s) != std::string::npos);
      CHECK(std::string(e.fix()).find("mltrain config schema --study") != std::string::npos);
    }
  }
}

TEST_CASE(
    "study files: durations through Period's parser; the resolved study.yaml reads back to the "
    "same bytes",
    "[tune][study_file]") {
  const auto d = tmpdir("study_yaml");
  write(d / "s.yaml",
        "study: {name: s, dir: " + d.string() +
            ", timeout: 1.5h}\nsampler: {name: gp, xi: 0.01}\n"
            "trial: {command: [/bin/echo, 'a b']}\n"
            "space:\n  optim.lr: {type: float, low: 1.0e-4, high: 0.1, log: true}\n"
            "  data.batch_size: {type: categorical, choices: [64, 128, '256', true]}\n");
  const auto c = load_study_config((d / "s.yaml").string(), {"study.timeout=45m"});
  CHECK(c.timeout_s() == 2700);
  REQUIRE(c.space.size() == 2);
  CHECK(c.space[0].name == "optim.lr");
  CHECK(c.space[1].choices == std::vector<nlohmann::json>{64, 128, "256", true});
  const std::string yaml = mltrain::config::to_yaml(c.file);
  CHECK(yaml.find("timeout: 2700s") != std::string::npos);
  write(d / "again.yaml", yaml);
  const auto back = load_study_config((d / "again.yaml").string(), {});
  CHECK(mltrain::config::to_yaml(back.file) == yaml);
  CHECK(back.space[1].choices == c.space[1].choices);
  // A test function's space is written out, so the folder says what was searched.
  write(d / "f.yaml", "objective: {function: branin}\n");
  const auto f = load_study_config((d / "f.yaml").string(), {});
  CHECK(mltrain::config::to_yaml(f.file).find("space:\n  x1:") != std::string::npos);
}

TEST_CASE("mltrain config schema --study lists every study key with its type and default",
          "[tune][study_file]") {
  const auto d = tmpdir("study_schema");
  REQUIRE(sh(kBin + " config schema --study > " + (d / "schema.txt").string()) == 0);
  std::ifstream in(d / "schema.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == mltrain::config::study_schema_text());
  for (const char* key : {"study.timeout  ", "sampler.name  ", "pruner.reduction_factor  ",
                          "objective.direction  ", "trial.command  ", "space.<name>.low  "})
    CHECK(text.find(key) != std::string::npos);
  CHECK(text.find("duration (90s | 30m | 2h | never)") != std::string::npos);
  CHECK(text.find("optim.lr") == std::string::npos);  // not the experiment's schema
}
